"""A profile's model mapping end to end: the official SDK → a real Edge → a real Node → the
upstream `model` actually sent (R-PROF-5)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support import Stack

pytestmark = pytest.mark.slow

# Chained on purpose: mapping ``alias-a`` must give ``alias-b``, never ``final-c``.
CHAIN = {"alias-a": "alias-b", "alias-b": "final-c"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    profiles = {
        "chained_openai": {"base": "openai", "model_mapping": CHAIN},
        "chained_ollama": {"base": "ollama", "model_mapping": CHAIN},
    }
    providers = [
        {"id": "p-openai", "profile": "chained_openai", "base_url": "{up:main}/v1", "capacity": 1},
        {"id": "p-ollama", "profile": "chained_ollama", "base_url": "{up:oll}", "capacity": 1},
    ]
    models = [
        {"id": "via-openai", "providers": {"p-openai": "alias-a"}},
        {"id": "via-ollama", "providers": {"p-ollama": "alias-a"}},
    ]
    with Stack(
        tmp_path_factory.mktemp("mapping"),
        upstreams={"main": "openai", "oll": "ollama"},
        providers=providers,
        models=models,
        profiles=profiles,
    ) as running:
        yield running


@pytest.mark.parametrize(("group", "upstream"), [("via-openai", "main"), ("via-ollama", "oll")])
def test_a_chained_model_mapping_is_applied_exactly_once_r_prof_5(
    stack: Stack, group: str, upstream: str
) -> None:
    """R-PROF-5: the served name passes through the profile's mapping once, whichever Node
    adapter runs it; the caller still sees the model it asked for."""
    stack.upstream(upstream).reset()
    with openai.OpenAI(base_url=stack.v1_url, api_key=stack.token, max_retries=0) as client:
        reply = client.chat.completions.create(
            model=group, messages=[{"role": "user", "content": "hi"}]
        )
    stack.wait_idle()
    assert reply.model == group
    assert [r.json["model"] for r in stack.upstream(upstream).server.requests] == ["alias-b"]
