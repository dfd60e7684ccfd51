"""The requests Claude Code and the Codex CLI really send (recorded: tests/fixtures/clients),
replayed on every run against a real Edge, Node and fake upstreams, so a machine without npm
still covers them (R-CLIENT-1): served through a translated group (R-XLATE-4, R-XLATE-5) and a
native one (R-XLATE-6), never a 500 (R-IN-7); what translation drops is named, counted, or
refused where the group says so."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import Stack
from tests.support.clients import clients_stack, recorded
from tests.support.translation import metric

pytestmark = pytest.mark.slow

CLAUDE = recorded("claude-code")
CODEX = recorded("codex")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with clients_stack(tmp_path_factory.mktemp("clients")) as running:
        yield running


@pytest.fixture(autouse=True)
def idle_after(stack: Stack) -> Iterator[None]:
    stack.reset_upstreams()
    for name in ("main", "claude"):
        stack.upstream(name).server.call_tools = False  # answer in text, as for "Say hello"
    yield
    stack.wait_idle()  # R-POOL-9: no lease held


def send(stack: Stack, request: Any, model: str) -> httpx.Response:
    url, headers, body = request.to(stack, model)
    with httpx.Client(timeout=30) as http:
        answer = http.post(url, headers=headers, content=body)
        answer.read()
    return answer


def upstream_bodies(stack: Stack, name: str, path: str) -> list[dict[str, Any]]:
    return [r.json for r in stack.upstream(name).server.requests if r.path == path]


def dropped(answer: httpx.Response) -> set[str]:
    return set(filter(None, answer.headers.get("x-iop-dropped", "").split(",")))


@pytest.mark.parametrize("index", range(len(CLAUDE)))
def test_claude_code_through_a_translated_group_is_served_with_its_fields_mapped(
    stack: Stack, index: int
) -> None:
    """R-XLATE-4: thinking and effort -> reasoning_effort, the system-role message kept in
    place, metadata.user_id -> user, every custom tool sent without defer_loading;
    R-XLATE-5: the hints named in x-iop-dropped and counted in /metrics."""
    request = CLAUDE[index]
    before = metric(stack, "iop_translation_dropped_total", field="cache_control")
    answer = send(stack, request, "claude-over-chat")
    assert answer.status_code == 200, answer.text[:500]
    assert "event: message_stop" in answer.text
    assert {"cache_control", "context_management", "tools[].defer_loading"} <= dropped(answer)
    (chat,) = upstream_bodies(stack, "main", "/v1/chat/completions")
    assert chat["model"] == "served-gpt"
    assert chat["reasoning_effort"] == "high"  # output_config.effort: high
    assert not {"thinking", "context_management", "output_config", "metadata"} & set(chat)
    roles = [m["role"] for m in chat["messages"]]
    asked = request.body["messages"]
    inner = [i for i, m in enumerate(asked) if m["role"] == "system"]
    assert roles[0] == "system" and all(roles[1 + i] == "system" for i in inner), roles
    assert chat["user"] == request.body["metadata"]["user_id"]
    names = [t["function"]["name"] for t in chat["tools"]]
    assert names == [t["name"] for t in request.body["tools"]]
    assert all(set(t["function"]) <= {"name", "description", "parameters"} for t in chat["tools"])
    after = metric(stack, "iop_translation_dropped_total", field="cache_control")
    assert after == before + 1


@pytest.mark.parametrize("index", range(len(CLAUDE)))
def test_claude_code_through_a_native_group_reaches_the_provider_unchanged(
    stack: Stack, index: int
) -> None:
    """R-XLATE-6: the client's fields and its anthropic-beta header reach the Messages API
    as sent; only the served model is the Edge's."""
    request = CLAUDE[index]
    answer = send(stack, request, "claude-native")
    assert answer.status_code == 200, answer.text[:500]
    assert "x-iop-dropped" not in answer.headers
    (seen,) = [r for r in stack.upstream("claude").server.requests if r.path == "/v1/messages"]
    assert seen.headers["anthropic-beta"] == request.headers["anthropic-beta"]
    body = seen.json
    assert body["model"] == "claude-served"
    assert {k: v for k, v in body.items() if k != "model"} == {
        k: v for k, v in request.body.items() if k != "model"
    }


def test_a_group_that_refuses_what_translation_drops_refuses_claude_code_naming_it(
    stack: Stack,
) -> None:
    """R-XLATE-5: ``translate: {unsupported: refuse}``: a 400 in the Messages shape naming
    the first field that would have been dropped; nothing reaches the provider."""
    answer = send(stack, CLAUDE[0], "claude-strict")
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "would drop" in error["message"] and "translate.unsupported: refuse" in error["message"]
    assert upstream_bodies(stack, "main", "/v1/chat/completions") == []


@pytest.mark.parametrize(
    ("model", "switch"),
    [
        ("codex-over-glm", None),  # reasoning.summary only: no effort, nothing to switch
        ("codex-over-qwen", None),
    ],
)
@pytest.mark.parametrize("index", range(len(CODEX)))
def test_codex_through_a_translated_group_is_served_with_its_tools_mapped(
    stack: Stack, index: int, model: str, switch: Any
) -> None:
    """R-XLATE-4: namespace tools become NS__name functions, the built-in web_search is left
    out and never described, prompt_cache_key passes; R-XLATE-5: include, client_metadata
    and the built-in tool are named in x-iop-dropped; R-IN-7: the tool whose schema has a
    property named ``type`` is served."""
    request = CODEX[index]
    answer = send(stack, request, model)
    assert answer.status_code == 200, answer.text[:500]
    assert "event: response.completed" in answer.text
    assert {"include", "client_metadata", "tools[] built-in tools"} <= dropped(answer)
    (chat,) = upstream_bodies(stack, "main", "/api/paas/v4/chat/completions") or upstream_bodies(
        stack, "main", "/v1/chat/completions"
    )
    assert chat["prompt_cache_key"] == request.body["prompt_cache_key"]
    assert not {"include", "client_metadata", "reasoning", "store"} & set(chat)
    names = {t["function"]["name"] for t in chat["tools"]}
    for tool in request.body["tools"]:
        if tool["type"] == "function":
            assert tool["name"] in names
        elif tool["type"] == "namespace":
            assert {f"{tool['name']}__{t['name']}" for t in tool["tools"]} <= names
        else:
            assert tool["type"] not in str(chat["tools"])
    assert chat.get("thinking") is switch and chat.get("chat_template_kwargs") is switch


@pytest.mark.parametrize("index", range(len(CODEX)))
def test_codex_through_a_native_group_reaches_the_provider_unchanged(
    stack: Stack, index: int
) -> None:
    """R-XLATE-6: reasoning, include, prompt_cache_key, store and the built-in tools reach a
    Responses provider as sent."""
    request = CODEX[index]
    answer = send(stack, request, "codex-native")
    assert answer.status_code == 200, answer.text[:500]
    (body,) = upstream_bodies(stack, "main", "/v1/responses")
    assert body["model"] == "served-gpt"
    assert {k: v for k, v in body.items() if k != "model"} == {
        k: v for k, v in request.body.items() if k != "model"
    }
