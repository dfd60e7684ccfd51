"""Usage attribution and the GLM endpoints end to end: the official SDK → a real Edge → a
real Node → the upstream URL and credential actually used, then `/metrics` (R-CFG-4,
R-PROF-7, R-PROF-7b, R-PROF-7c, R-CFG-12)."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import openai
import pytest

from catalog.config.profiles import BUILTIN_PROFILES
from tests.support import PRINCIPAL_REF, TOKEN_REF, Stack

pytestmark = pytest.mark.slow

GENERAL_KEY = "zai-general-canary-1f3a"
CODING_KEY = "zai-coding-canary-9c2e"


def builtin_url_on_the_fake(profile: str) -> str:
    """R-PROF-7c: the built-in profile's own base URL with only its host redirected to the
    loopback fake, so a wrong built-in path fails the full-cycle test."""
    url = urlsplit(BUILTIN_PROFILES[profile].base_url)
    assert (url.scheme, url.netloc) == ("https", "api.z.ai")
    return "{up:main}" + url.path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    providers = [
        {
            "id": "glm-general",
            "profile": "glm",
            "base_url": builtin_url_on_the_fake("glm"),
            "credential": {"env": "ZAI_API_KEY"},
            "capacity": 2,
        },
        {
            "id": "glm-coding",
            "profile": "glm_coding",
            "base_url": builtin_url_on_the_fake("glm_coding"),
            "credential": {"env": "ZAI_CODING_PLAN_KEY"},
            "capacity": 2,
        },
        {"id": "p-shared", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 2},
    ]
    models = [
        {"id": "glm-4.6", "providers": {"glm-general": "glm-4.6"}},
        {"id": "glm-4.6-coding", "providers": {"glm-coding": "glm-4.6"}},
        {"id": "team-chat", "usage_attribution": "model_group", "providers": {"p-shared": "x"}},
    ]
    with Stack(
        tmp_path_factory.mktemp("usage"),
        providers=providers,
        models=models,
        env={"ZAI_API_KEY": GENERAL_KEY, "ZAI_CODING_PLAN_KEY": CODING_KEY},
    ) as running:
        yield running


@pytest.fixture
def client(stack: Stack) -> Iterator[openai.OpenAI]:
    stack.upstream().reset()
    with openai.OpenAI(base_url=stack.v1_url, api_key=stack.token, max_retries=0) as oai:
        yield oai
    stack.wait_idle()


def token_samples(stack: Stack) -> list[dict[str, str]]:
    return [
        {**sample.labels, "value": str(sample.value)}
        for sample in stack.metrics()
        if sample.name == "iop_tokens_total" and sample.value > 0
    ]


def ask(client: openai.OpenAI, model: str) -> None:
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content


def test_general_api_and_coding_plan_keep_separate_endpoints_and_credentials_r_prof_7b(
    stack: Stack, client: openai.OpenAI
) -> None:
    ask(client, "glm-4.6")
    ask(client, "glm-4.6-coding")
    seen = [
        (r.path, r.headers.get("authorization"), r.json["model"])
        for r in stack.upstream().server.requests
    ]
    assert seen == [
        ("/api/paas/v4/chat/completions", f"Bearer {GENERAL_KEY}", "glm-4.6"),
        ("/api/coding/paas/v4/chat/completions", f"Bearer {CODING_KEY}", "glm-4.6"),
    ]
    # The caller's own Edge token never goes upstream.
    assert all(stack.token not in str(r.headers) for r in stack.upstream().server.requests)
    attributed = {
        s["attributed_to"] for s in token_samples(stack) if s["model_group"].startswith("glm")
    }
    assert {"glm-general", "glm-coding"} <= attributed


def test_metrics_attribute_tokens_to_the_provider_or_the_model_group_r_cfg_4(
    stack: Stack, client: openai.OpenAI
) -> None:
    ask(client, "team-chat")
    ask(client, "glm-4.6")
    samples = token_samples(stack)
    by_group = {(s["model_group"], s["direction"]): s for s in samples}
    grouped = by_group[("team-chat", "in")]
    assert (grouped["attribution"], grouped["attributed_to"]) == ("model_group", "team-chat")
    direct = by_group[("glm-4.6", "out")]
    assert (direct["attribution"], direct["attributed_to"]) == ("provider", "glm-general")
    for sample in (grouped, direct):  # R-CFG-12: the token_ref is the unit of per-app usage
        assert (sample["principal_ref"], sample["token_ref"]) == (PRINCIPAL_REF, TOKEN_REF)
    text = "\n".join(str(s) for s in samples) + stack.logs()
    assert GENERAL_KEY not in text and CODING_KEY not in text and stack.token not in text
