"""Graceful stop: refuse new runs, let in-flight ones finish within the grace, then fail
the rest with node_shutdown, close with 1001."""

from __future__ import annotations

import asyncio
import math

from nodes import wire
from nodes.agent.client import Backoff, NodeClient
from tests.fakes.edge import FakeEdge
from tests.support.node_agent import node_config
from tests.support.payloads import chat_body, node_payload


def start(fake_edge: FakeEdge, tmp_path, grace: float) -> tuple[NodeClient, asyncio.Task[None]]:
    client = NodeClient(
        node_config(fake_edge, tmp_path),
        shutdown_grace_s=grace,
        backoff=Backoff(initial=0.02, cap=0.2),
        close_timeout_s=1.0,
    )
    return client, asyncio.create_task(client.run())


async def test_runs_past_the_grace_end_with_node_shutdown_and_the_socket_closes_1001(
    fake_edge, fake_openai, tmp_path
):
    fake_openai.faults.stall_mid_stream = math.inf
    client, task = start(fake_edge, tmp_path, grace=0.3)
    conn = await fake_edge.next_connection()
    await conn.tunnel("slow", "p1", "chat_completions", chat_body(stream=True), stream=True)
    async with asyncio.timeout(5):
        await fake_openai.streaming.wait()
    client.stop()
    await conn.tunnel("late", "p1", "chat_completions", chat_body())  # refused during grace
    late = await conn.wait_end("late")
    slow = await conn.wait_end("slow")
    async with asyncio.timeout(10):
        await task
    # R-HEALTH-1: the late run never started, so it may go elsewhere; the slow one had
    # streamed, so it may not.
    expected = {
        "late": ("node_shutdown", True, wire.PHASE_BEFORE_FIRST_BYTE),
        "slow": ("node_shutdown", False, wire.PHASE_AFTER_FIRST_BYTE),
    }
    for name, log in (("late", late), ("slow", slow)):
        assert len(log.ends) == 1
        error = log.ends[0].error
        assert error is not None
        assert (error.code, error.retryable, error.phase) == expected[name]
    assert len(fake_openai.requests) == 1  # the late run never went upstream
    assert conn.close_code == 1001
    async with asyncio.timeout(5):
        await fake_openai.disconnected.wait()
    assert client.registries.current is not None and client.registries.current.closed


async def test_runs_that_finish_within_the_grace_end_normally(fake_edge, fake_openai, tmp_path):
    fake_openai.faults.hold_mid_stream = hold = asyncio.Event()
    client, task = start(fake_edge, tmp_path, grace=10)
    conn = await fake_edge.next_connection()
    await conn.tunnel("r1", "p1", "chat_completions", chat_body(stream=True), stream=True)
    async with asyncio.timeout(5):
        await fake_openai.streaming.wait()
    client.stop()
    await conn.send(wire.Ping(ts=1.0))  # still served while draining
    await conn.next_of(wire.Pong)
    hold.set()
    log = await conn.wait_end("r1")
    async with asyncio.timeout(10):
        await task
    assert log.ends[0].ok and log.text == fake_openai.requests[0].response.decode()
    assert conn.close_code == 1001


async def test_stop_while_the_edge_is_unreachable_returns_promptly(tmp_path, fake_openai):
    fake_edge = FakeEdge(node_payload())
    await fake_edge.start()
    await fake_edge.close()  # nothing listens on that port any more
    client, task = start(fake_edge, tmp_path, grace=10)
    client.stop()
    async with asyncio.timeout(5):
        await task
