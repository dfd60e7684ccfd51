"""Nothing a peer sends reaches a log unescaped or unbounded (R-TLS-9), on a real Edge and real
Nodes: a Node's ``unavailable`` map that forges a log line, names providers it does not have
and runs long; an OTLP endpoint whose URL carries a password, on a collector that refuses."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator

import openai
import pytest
from websockets.asyncio.client import connect

from nodes import wire
from tests.support import Stack
from tests.support.otlp import tracing_env
from tests.support.ports import free_port
from tests.support.stack import provider_row

pytestmark = pytest.mark.slow

PASSWORD = "otlp-pass-5e0b2d"
FORGED = "INFO iop.refresh revision 99 is now active"
WAIT_S = 30.0


@pytest.fixture(scope="module")
def endpoint_port() -> int:
    return free_port()  # nothing listens there: every export fails


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, endpoint_port: int) -> Iterator[Stack]:
    endpoint = f"http://iop-user:{PASSWORD}@127.0.0.1:{endpoint_port}"
    nodes = [
        {"id": "node-1", "providers": [
            {"id": "p-openai", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 4}]},
        # Stopped once started: a raw websocket speaks for it, as a Node someone took over.
        {"id": "node-forge", "providers": [
            {"id": "p-forge", "profile": "openai", "base_url": "{up:main}/v1"}]},
    ]  # fmt: skip
    models = [
        {"id": "gpt-test", "providers": {"p-openai": "served-gpt"}},
        {"id": "forge", "providers": {"p-forge": "served"}},
    ]
    env = tracing_env(endpoint, LOG_FORMAT="human", OTEL_EXPORTER_OTLP_TIMEOUT="1")
    stack = Stack(tmp_path_factory.mktemp("peer-text"), nodes=nodes, models=models, env=env)
    try:
        stack.start(wait_online=False)
        stack.nodes[1].stop()
        stack.wait_until(
            lambda snap: provider_row(snap, "p-openai")["online"], what="p-openai online"
        )
        yield stack
    finally:
        stack.stop()


async def _forge(stack: Stack, unavailable: dict[str, str]) -> str:
    """Register as node-forge with its token, report ``unavailable`` in ``ready``; p-forge's
    reason on /pool while connected."""
    headers = {
        "Authorization": f"Bearer {stack.nodes[1].env['IOP_NODE_TOKEN']}",
        wire.NODE_ID_HEADER: "node-forge",
    }
    url = f"ws://127.0.0.1:{stack.ports['edge']}/ws/node"
    async with connect(url, additional_headers=headers, proxy=None, ping_interval=None) as ws:
        await ws.send(wire.encode(wire.Register(node_id="node-forge")), text=True)
        answer = wire.decode_from_edge(await asyncio.wait_for(ws.recv(), WAIT_S))
        assert isinstance(answer, wire.RegisterResponse)
        ready = wire.Ready(
            generation=answer.generation, revision=answer.payload.revision, unavailable=unavailable
        )
        await ws.send(wire.encode(ready), text=True)
        await asyncio.to_thread(
            stack.wait_until,
            lambda snap: bool(provider_row(snap, "p-forge")["unavailable"]),
            what="p-forge unavailable",
        )
        snapshot = await asyncio.to_thread(stack.pool_snapshot)
        return str(provider_row(snapshot, "p-forge")["unavailable"])


def test_a_nodes_unavailable_map_is_filtered_capped_and_logged_with_repr_r_tls_9(stack: Stack):
    """R-TLS-9: a forged log line inside a reason stays inside its own line, escaped; ids of
    providers the Node does not have are counted, never shown; a reason is bounded."""
    unavailable = {
        "p-forge": f"no\n2026-12-02 06:00:00,000 {FORGED}",
        f"ghost\n2026-12-02 06:00:01,000 {FORGED}": "x",
        **{f"junk-{index}": "y" * 5000 for index in range(40)},
    }
    shown = asyncio.run(_forge(stack, unavailable))
    assert shown == unavailable["p-forge"]  # /pool (JSON) shows the reason as it came
    log = (stack.dir / "edge.log").read_text()
    assert not re.search(rf"^\S+ \S+ {re.escape(FORGED)}", log, re.MULTILINE)
    (line,) = [line for line in log.splitlines() if "will not run provider p-forge" in line]
    assert line.endswith(f"will not run provider p-forge: 'no\\n2026-12-02 06:00:00,000 {FORGED}'")
    assert "ghost" not in log and "junk-" not in log
    assert "node node-forge reported 41 unavailable provider(s) it does not have: ignored" in log
    assert all(len(line) < 1000 for line in log.splitlines())


def test_an_otlp_endpoints_password_is_in_no_log_line_r_tls_9(stack: Stack, endpoint_port: int):
    """R-TLS-9: the export-failure warning names the endpoint without its user-info, on the
    Edge and on the Node alike."""
    warning = f"trace export to http://127.0.0.1:{endpoint_port} failed"
    deadline = time.monotonic() + WAIT_S
    with openai.OpenAI(base_url=stack.v1_url, api_key=stack.token, max_retries=0) as client:
        while not all(
            warning in (stack.dir / name).read_text() for name in ("edge.log", "node-1.log")
        ):
            assert time.monotonic() < deadline, stack.logs()[-3000:]
            client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "hi"}], timeout=10
            )
    for name in ("edge.log", "node-1.log", "node-forge.log"):
        text = (stack.dir / name).read_text()
        assert PASSWORD not in text and "iop-user" not in text, name
