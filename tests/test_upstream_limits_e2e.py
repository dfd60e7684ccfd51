"""R-TLS-4 through a real Edge and a real ``iop-node``: an upstream that redirects, sets
cookies or sends a body without end is refused with a clear error, nothing reaches the other
host, and no lease is held afterwards (R-POOL-9)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes import CLI_TOOL
from tests.support import Stack
from tests.support.fixtures import shared_stack

pytestmark = pytest.mark.slow

BODY_CAP = 1024 * 1024
CHAT = "/v1/chat/completions"


def _options(directory: Path) -> dict[str, Any]:
    providers = [
        {"id": "p-openai", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 2},
        {"id": "p-fork", "type": "cli", "capacity": 1,
         "command": [sys.executable, CLI_TOOL, "fork", str(directory / "fork.pid")]},
    ]  # fmt: skip
    models = [
        {"id": "gpt-test", "providers": {"p-openai": "served-gpt"}},
        {"id": "fork", "providers": {"p-fork": "fork"}},
    ]
    nodes = [
        {"id": "node-1", "providers": providers,
         "config": {"limits": {"max_body_bytes": BODY_CAP}}},
    ]  # fmt: skip
    return {
        "upstreams": {"main": "openai", "elsewhere": "openai"},
        "nodes": nodes,
        "models": models,
    }


stack, _clean_slate = shared_stack("limits", _options)


def _chat(model: str = "gpt-test") -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}]}


def test_a_redirect_to_another_host_is_an_upstream_error_and_never_followed(
    stack: Stack, http: httpx.Client
):
    stack.upstream().server.faults.redirect_to = stack.upstream("elsewhere").url + CHAT
    response = http.post(CHAT, json=_chat())
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "upstream_error"
    assert "redirect" in error["message"] and "not followed" in error["message"]
    assert stack.upstream("elsewhere").server.requests == []


def test_cookies_set_by_the_upstream_never_come_back_on_the_next_request(
    stack: Stack, http: httpx.Client
):
    stack.upstream().server.faults.set_cookie = "session=first-caller; Path=/"
    for _ in range(2):
        assert http.post(CHAT, json=_chat()).status_code == 200
    assert [r.headers.get("cookie") for r in stack.upstream().server.requests] == [None, None]


def test_a_body_without_end_stops_at_the_nodes_cap(stack: Stack, http: httpx.Client):
    """node.yaml limits.max_body_bytes, end to end: the read stops, the upstream is cut."""
    server = stack.upstream().server
    server.faults.endless_body = b"z" * 65536
    response = http.post(CHAT, json=_chat())
    assert response.status_code == 502
    assert "limits.max_body_bytes" in response.json()["error"]["message"]
    assert stack.upstream().wait_disconnect(10)
    assert server.endless_sent < BODY_CAP + 16 * 1024 * 1024  # far below the fault's 1 GiB


def test_a_cli_that_forks_and_exits_answers_and_leaves_no_child(stack: Stack, http: httpx.Client):
    from tests.support.pids import alive

    response = http.post(CHAT, json=_chat("fork"))
    assert response.status_code == 200
    assert "forked" in response.json()["choices"][0]["message"]["content"]
    _, child = map(int, (stack.dir / "fork.pid").read_text().split())
    stack.wait_until(lambda _: not alive(child), what="the forked child gone")
