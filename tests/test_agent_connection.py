"""The Node's connection life: register -> ready, heartbeats, reconnects, refusals."""

from __future__ import annotations

import asyncio
import logging
import math

import msgspec
import pytest

from nodes import wire
from nodes.agent.client import Backoff
from nodes.envelope import Binding
from tests.fakes.edge import FakeEdge
from tests.support.managed import mint_keys
from tests.support.node_agent import running_node
from tests.support.payloads import chat_body, node_payload, openai_provider
from tests.support.tls import self_signed


async def test_register_then_register_response_then_ready_with_the_payload_applied(
    fake_edge, tmp_path
):
    """R-NODE-1: the Node applies the payload and installs handlers before its ready ack."""
    async with running_node(fake_edge, tmp_path) as client:
        conn = await fake_edge.next_connection()
        register, ready = conn.received[0], conn.received[1]
        assert register == wire.Register(
            node_id=fake_edge.node_id,
            protocol=wire.PROTOCOL_VERSION,
            agent_version=register.agent_version,
        )
        assert ready == wire.Ready(generation=conn.generation, revision=fake_edge.payload.revision)
        assert client.registries.current is not None
        assert client.registries.current.revision == fake_edge.payload.revision
        assert set(client.registries.current.adapters) == {"p1"}
        assert conn.headers["Authorization"] == f"Bearer {fake_edge.token}"
        assert conn.headers[wire.NODE_ID_HEADER] == fake_edge.node_id


async def test_ping_is_answered_with_pong_and_the_node_pings_too(fake_openai, tmp_path):
    payload = node_payload(openai_provider(fake_openai.url, pid="p1"))
    async with (
        FakeEdge(payload, heartbeat_interval_s=0.05) as fake_edge,
        running_node(fake_edge, tmp_path),
    ):
        conn = await fake_edge.next_connection()
        await conn.send(wire.Ping(ts=12.5))
        assert await conn.next_of(wire.Pong) == wire.Pong(ts=12.5)
        assert isinstance(await conn.next_of(wire.Ping), wire.Ping)


async def test_reconnects_after_the_edge_closes_and_is_ready_with_the_new_generation(
    fake_edge, fake_openai, tmp_path
):
    fake_openai.faults.stall_mid_stream = math.inf
    async with running_node(fake_edge, tmp_path) as client:
        first = await fake_edge.next_connection()
        await first.tunnel("r1", "p1", "chat_completions", chat_body(stream=True), stream=True)
        async with asyncio.timeout(5):
            await fake_openai.streaming.wait()
        await first.ws.close(1000, "edge restarting")  # a normal close is a cue to reconnect
        second = await fake_edge.next_connection()
        ready = second.received[1]
        assert ready == wire.Ready(
            generation=second.generation, revision=fake_edge.payload.revision
        )
        assert second.generation == first.generation + 1
        assert client.generation == second.generation
        # The in-flight run was dropped with the connection: upstream closed, no run_end.
        async with asyncio.timeout(5):
            await fake_openai.disconnected.wait()
        assert "r1" not in second.runs and first.run("r1").ends == []
        fake_openai.faults.stall_mid_stream = None
        log = await second.tunnel("r2", "p1", "chat_completions", chat_body())
        await second.wait_end("r2")
        assert log.ends[0].ok


async def test_reconnects_after_the_connection_drops_abruptly(fake_edge, tmp_path):
    async with running_node(fake_edge, tmp_path):
        first = await fake_edge.next_connection()
        first.ws.transport.abort()
        second = await fake_edge.next_connection()
        assert second.generation == first.generation + 1


async def test_silence_past_the_heartbeat_timeout_drops_and_reconnects(fake_openai, tmp_path):
    payload = node_payload(openai_provider(fake_openai.url, pid="p1"))
    fake_edge = FakeEdge(
        payload, heartbeat_interval_s=60, heartbeat_timeout_s=0.3, answer_pings=False
    )
    async with fake_edge, running_node(fake_edge, tmp_path):
        first = await fake_edge.next_connection()
        second = await fake_edge.next_connection()
        assert first.closed.is_set() and first.close_code == wire.CLOSE_HEARTBEAT_TIMEOUT
        assert second.generation == first.generation + 1


async def test_refused_credentials_are_logged_and_retried_without_crashing(
    fake_edge, tmp_path, caplog
):
    caplog.set_level(logging.INFO)
    wrong = "wrong-token-value-42"
    async with running_node(fake_edge, tmp_path, token=wrong) as client:
        await fake_edge.wait_refused(3)
        assert "the Edge refused node node-test (HTTP 403)" in caplog.text
        assert "not in the Edge's running revision" in caplog.text
        assert client.generation is None
        fake_edge.token = wrong  # the operator fixes the Edge side; the Node is still trying
        conn = await fake_edge.next_connection()
        assert conn.generation >= 1
    assert wrong not in caplog.text


async def test_token_never_appears_in_logs_even_at_debug(fake_edge, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="iop_node.websocket")  # header dumps included
    async with running_node(fake_edge, tmp_path):
        conn = await fake_edge.next_connection()
        await conn.tunnel("r1", "p1", "chat_completions", chat_body())
        await conn.wait_end("r1")
    assert "Authorization: <redacted>" in caplog.text
    assert fake_edge.token not in caplog.text


async def test_invalid_frame_closes_with_protocol_error_and_reconnects(fake_edge, tmp_path):
    async with running_node(fake_edge, tmp_path):
        first = await fake_edge.next_connection()
        await first.ws.send('{"type": "no_such_message"}')
        second = await fake_edge.next_connection()
        assert first.close_code == wire.CLOSE_PROTOCOL_ERROR
        assert second.generation == first.generation + 1


async def test_node_with_credential_plane_keys_serves_a_run_over_wss_trusting_its_ca_file(
    fake_openai, tmp_path
):
    """R-TLS-2: a Node whose config carries credential_plane (which requires wss://) dials a
    TLS Edge it verifies with tls.ca_file and serves a run with the credential the Edge sealed
    for it; the fake Edge stands in for the Edge and its control plane (the real managed
    Edge end to end: tests/test_managed_e2e.py)."""
    cert, server_ctx = self_signed(tmp_path)
    keys = mint_keys(tmp_path / "keys", "node-test")
    managed = {"tls": {"ca_file": str(cert)}, "credential_plane": keys.node_plane()}
    bearer = wire.AuthPayload(type="bearer")
    payload = node_payload(openai_provider(fake_openai.url, pid="p1", auth=bearer))
    async with FakeEdge(payload, ssl_context=server_ctx) as fake_edge:
        assert fake_edge.url.startswith("wss://")
        async with running_node(fake_edge, tmp_path, config=managed):
            conn = await fake_edge.next_connection()
            binding = Binding("t1", "node-test", "p1", "slot", 1, 1, conn.generation)
            conn.run("t1")
            await conn.send(
                wire.TunnelRequest(
                    run_id="t1",
                    provider_id="p1",
                    operation="chat_completions",
                    stream=False,
                    body=msgspec.Raw(msgspec.json.encode(chat_body())),
                    lease_envelope=keys.envelope(b"sk-test", binding),
                )
            )
            assert (await conn.wait_end("t1")).ends[0].ok
    assert [r.headers.get("authorization") for r in fake_openai.requests] == ["Bearer sk-test"]


async def test_wss_without_the_right_ca_does_not_connect_and_keeps_retrying(
    fake_openai, tmp_path, caplog
):
    caplog.set_level(logging.WARNING)
    _, server_ctx = self_signed(tmp_path)
    payload = node_payload(openai_provider(fake_openai.url, pid="p1"))
    fake_edge = FakeEdge(payload, ssl_context=server_ctx)
    async with fake_edge, running_node(fake_edge, tmp_path) as client:  # trusts system CAs only
        with pytest.raises(TimeoutError):  # several attempts fit in this window
            await fake_edge.next_connection(within=1.0)
        assert client.generation is None
    assert "the Edge's certificate was refused" in caplog.text


def test_backoff_grows_exponentially_with_jitter_and_is_capped_at_30s():
    low = Backoff(rng=lambda: 0.0)  # the jitter's lower bound: half the delay
    assert [low.next() for _ in range(8)] == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0]
    high = Backoff(rng=lambda: 0.999999)
    delays = [high.next() for _ in range(12)]
    assert max(delays) <= 30.0 and delays[-1] > 29.9
    high.reset()
    assert high.next() < 0.5
