"""A Node's own policy bounds what its Edge can make it do (R-TLS-3), with real processes:
a denied command, upstream host and secret are refused on the Node, reported to the Edge,
shown unavailable with the reason on /pool, never run, never a candidate."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes import CLI_TOOL
from tests.support import Stack

pytestmark = pytest.mark.slow

PIDFILE = "denied-cli.pid"


def _providers(directory: Path) -> list[dict[str, Any]]:
    openai = {"profile": "openai", "capacity": 2}
    return [
        {"id": "p-ok", "base_url": "{up:main}/v1", **openai,
         "credential": {"env": "IOP_ALLOWED_KEY"}},
        {"id": "p-denied-host", "base_url": "{up:other}/v1", **openai},
        {"id": "p-denied-secret", "base_url": "{up:main}/v1", **openai,
         "credential": {"env": "IOP_OTHER_KEY"}},
        {"id": "p-denied-cmd", "type": "cli",
         "command": [sys.executable, CLI_TOOL, "hang", str(directory / PIDFILE)]},
    ]  # fmt: skip


POLICY = {
    "commands": [[sys.executable, CLI_TOOL, "echo"]],
    "hosts": ["{up:main}"],
    "secrets": {"env": ["IOP_ALLOWED_KEY"]},
}
MODELS = [
    {"id": name, "providers": {pid: "served"}}
    for name, pid in [
        ("ok", "p-ok"),
        ("denied-host", "p-denied-host"),
        ("denied-secret", "p-denied-secret"),
        ("denied-cmd", "p-denied-cmd"),
    ]
]
REASONS = {
    "p-denied-host": "upstream host 127.0.0.1:{port} is not an allowed host",
    "p-denied-secret": "secret env IOP_OTHER_KEY is not an allowed name",
    "p-denied-cmd": "is not an allowed command prefix",
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("policy")
    nodes = [{"id": "node-1", "providers": _providers(directory), "config": {"policy": POLICY}}]
    stack = Stack(
        directory,
        upstreams={"main": "openai", "other": "openai"},
        nodes=nodes,
        models=MODELS,
        env={"IOP_ALLOWED_KEY": "sk-allowed", "IOP_OTHER_KEY": "sk-other-secret"},
    )
    try:
        stack.start(wait_online=False)  # the denied providers never come online
        stack.wait_until(
            lambda snap: any(p["online"] for p in snap["providers"]), what="p-ok online"
        )
        yield stack
    finally:
        stack.stop()


def test_denied_providers_are_unavailable_on_pool_with_the_reason_r_tls_3(stack: Stack):
    rows = {p["provider_id"]: p for p in stack.pool_snapshot()["providers"]}
    assert rows["p-ok"]["online"] and rows["p-ok"]["unavailable"] is None
    other_port = stack.upstream("other").url.rsplit(":", 1)[1]
    for pid, reason in REASONS.items():
        assert not rows[pid]["online"]
        assert rows[pid]["unavailable"].startswith("refused by node policy: ")
        assert reason.format(port=other_port) in rows[pid]["unavailable"]
    assert "sk-other-secret" not in str(rows)


@pytest.mark.parametrize("model", ["denied-host", "denied-secret", "denied-cmd"])
def test_a_request_for_a_denied_provider_is_refused_and_nothing_runs_r_tls_3(
    stack: Stack, http: httpx.Client, model: str
):
    stack.reset_upstreams()
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_available_provider"
    assert stack.upstream("other").server.requests == []
    assert stack.upstream("main").server.requests == []
    assert not (stack.dir / PIDFILE).exists()  # the denied command never started
    stack.wait_idle()


def test_the_allowed_provider_still_serves_r_tls_3(stack: Stack, http: httpx.Client):
    body = {"model": "ok", "messages": [{"role": "user", "content": "hi"}]}
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    stack.wait_idle()


def test_the_node_logs_each_refusal_once_per_connection_r_tls_3(stack: Stack):
    log = stack.nodes[0].log.read_text()
    for pid in REASONS:
        assert log.count(f"provider {pid} refused by node policy") == 1
