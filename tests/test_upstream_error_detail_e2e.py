"""Upstream and CLI error detail stays in the logs: the caller gets a generic message
(``upstream returned HTTP 400``, ``the CLI program failed``), the Node's log line for the run
has the detail (upstream host:port and message, stderr), and the Edge's log line names the
same run (docs/http-api.md, "Upstream error messages").

A real Edge (daphne), a real ``iop-node`` and loopback fake upstreams whose error bodies carry
a marker string and an address; the marker must never reach the client.
"""

from __future__ import annotations

import re
import secrets
import socket
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fakes import CLI_TOOL
from tests.support import Stack
from tests.support.fixtures import shared_stack
from tests.support.payloads import chat_body

pytestmark = pytest.mark.slow

CHAT_PATH = "/v1/chat/completions"
INTERNAL = "billing-db.internal:5432"  # an address an upstream might name in its error text
CLI_MARKER = "CLI-MARKER-" + secrets.token_hex(6)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _options(directory: Path) -> dict[str, Any]:
    providers = [
        {"id": "p-tunnel", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 2},
        {"id": "p-ollama", "profile": "ollama", "base_url": "{up:ollama}", "capacity": 2},
        {
            "id": "p-cli",
            "type": "cli",
            "command": [sys.executable, CLI_TOOL, "fail", "3", f"{CLI_MARKER} at {INTERNAL}"],
            "capacity": 1,
        },
        {
            "id": "p-refused",
            "profile": "openai",
            "base_url": f"http://127.0.0.1:{closed_port()}/v1",
            "capacity": 1,
        },
    ]
    models = [
        {"id": "tunnel", "providers": {"p-tunnel": "served-tunnel"}},
        {"id": "ollama", "providers": {"p-ollama": "llama3:8b"}},
        {"id": "cli", "providers": {"p-cli": "fail"}},
        {"id": "refused", "providers": {"p-refused": "served-refused"}},
    ]
    return {
        "upstreams": {"main": "openai", "ollama": "ollama"},
        "providers": providers,
        "models": models,
    }


stack, _clean_slate = shared_stack("error-detail", _options)


def upstream_address(stack: Stack, name: str) -> str:
    return f"127.0.0.1:{stack.upstream(name).server.port}"


def node_log_run(stack: Stack, pattern: str) -> str:
    """The run id of the Node's log line matching ``pattern`` (which must be there)."""
    found = re.findall(r"run (\S+) failed: " + pattern, stack.nodes[0].log.read_text())
    assert len(found) == 1, stack.logs()
    return str(found[0])


def assert_edge_logged(stack: Stack, run_id: str, what: str) -> None:
    assert f"run {run_id} on node node-1 failed: {what}" in stack.edge.log.read_text(), stack.logs()


@pytest.mark.parametrize(("model", "upstream"), [("tunnel", "main"), ("ollama", "ollama")])
@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_error_body_never_reaches_the_client_and_is_in_the_node_log(
    stack: Stack, http: httpx.Client, model: str, upstream: str, stream: bool
) -> None:
    marker = "UPSTREAM-MARKER-" + secrets.token_hex(6)
    faults = stack.upstream(upstream).server.faults
    faults.status, faults.error_message = 400, f"{marker}: bad key for tenant at {INTERNAL}"
    resp = http.post(CHAT_PATH, json=chat_body("hi", model=model, stream=stream))
    assert resp.status_code == 502
    assert resp.json()["error"] == {
        "message": "upstream returned HTTP 400",
        "type": "server_error",
        "param": None,
        "code": "upstream_error",
    }
    for secret in (marker, INTERNAL, upstream_address(stack, upstream)):
        assert secret not in resp.text
    where = re.escape(upstream_address(stack, upstream))
    run_id = node_log_run(stack, rf"upstream_error \(HTTP 400\): {where} .*{marker}")
    assert_edge_logged(stack, run_id, "upstream_error (HTTP 400): upstream returned HTTP 400")
    assert marker not in stack.edge.log.read_text()


def test_the_official_sdk_sees_only_the_generic_message(stack: Stack, oai: openai.OpenAI) -> None:
    marker = "SDK-MARKER-" + secrets.token_hex(6)
    faults = stack.upstream().server.faults
    faults.status, faults.error_message = 403, f"{marker} at {INTERNAL}"
    with pytest.raises(openai.InternalServerError) as caught:
        oai.chat.completions.create(model="tunnel", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 502
    assert caught.value.body == {
        "message": "upstream returned HTTP 403",
        "type": "server_error",
        "param": None,
        "code": "upstream_error",
    }
    assert marker not in str(caught.value) and marker not in caught.value.response.text
    node_log_run(stack, rf"upstream_error \(HTTP 403\): .*{marker}")


@pytest.mark.parametrize("stream", [False, True])
def test_a_failing_cli_program_is_the_cli_program_failed_and_its_stderr_stays_in_the_log(
    stack: Stack, http: httpx.Client, stream: bool
) -> None:
    before = stack.nodes[0].log.read_text().count(CLI_MARKER)
    resp = http.post(CHAT_PATH, json=chat_body("hi", model="cli", stream=stream))
    assert resp.status_code == 502
    assert resp.json()["error"]["message"] == "the CLI program failed"
    assert CLI_MARKER not in resp.text and INTERNAL not in resp.text
    node_log = stack.nodes[0].log.read_text()
    assert node_log.count(CLI_MARKER) == before + 1
    assert re.search(
        rf"run \S+ failed: upstream_error: command exited with code 3: {CLI_MARKER}", node_log
    )
    assert CLI_MARKER not in stack.edge.log.read_text()


def test_a_refused_connection_does_not_name_the_upstream_address(
    stack: Stack, http: httpx.Client
) -> None:
    resp = http.post(CHAT_PATH, json=chat_body("hi", model="refused"))
    assert resp.status_code == 502
    assert resp.json()["error"]["message"] == "cannot connect to the upstream"
    assert "127.0.0.1" not in resp.text
    node_log_run(stack, r"upstream_error: upstream 127\.0\.0\.1:\d+: ClientConnectorError")


def test_a_stream_cut_mid_way_ends_with_an_in_band_error_without_the_address(
    stack: Stack, http: httpx.Client
) -> None:
    stack.upstream().server.faults.drop_mid_stream = True
    with http.stream("POST", CHAT_PATH, json=chat_body("hi", model="tunnel", stream=True)) as resp:
        assert resp.status_code == 200
        text = "".join(resp.iter_text())
    events = [line for line in text.splitlines() if line.startswith('data: {"error"')]
    assert len(events) == 1
    assert "the upstream closed the connection mid-response" in events[0]
    assert upstream_address(stack, "main") not in text
    where = re.escape(upstream_address(stack, "main"))
    node_log_run(stack, rf"upstream_error \(HTTP 200\): upstream {where}: ClientPayloadError")
