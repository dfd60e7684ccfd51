"""Config refresh on the Node (R-NODE-5): build, swap, drain the old registry, then close it."""

from __future__ import annotations

import asyncio

from nodes import wire
from nodes.agent.registry import Registries, Registry
from tests.fakes.edge import FakeEdge
from tests.support.node_agent import running_node
from tests.support.payloads import chat_body, node_payload, openai_provider


async def test_refresh_swaps_registry_while_an_active_run_finishes_on_the_old_one(
    fake_openai, tmp_path
):
    """R-NODE-5: new runs use the new registry; the old closes only after its runs drain."""
    old_payload = node_payload(openai_provider(fake_openai.url, pid="p1", headers={"x-rev": "old"}))
    new_payload = node_payload(openai_provider(fake_openai.url, pid="p1", headers={"x-rev": "new"}))
    assert old_payload.revision != new_payload.revision
    fake_openai.faults.hold_mid_stream = hold = asyncio.Event()
    async with FakeEdge(old_payload) as edge, running_node(edge, tmp_path) as client:
        conn = await edge.next_connection()
        old = client.registries.current
        assert old is not None and old.revision == old_payload.revision
        long_run = await conn.tunnel(
            "long", "p1", "chat_completions", chat_body(stream=True), stream=True
        )
        async with asyncio.timeout(5):
            await fake_openai.streaming.wait()

        await conn.send(wire.ConfigRefresh(payload=new_payload))
        ack = await conn.next_of(wire.ConfigRefreshAck)
        assert ack == wire.ConfigRefreshAck(revision=new_payload.revision, ok=True)
        new = client.registries.current
        assert new is not None and new is not old and new.revision == new_payload.revision

        fake_openai.faults.hold_mid_stream = None
        await conn.tunnel("fresh", "p1", "chat_completions", chat_body())
        fresh = await conn.wait_end("fresh")
        assert fresh.ends[0].ok
        assert fake_openai.requests[1].headers["x-rev"] == "new"  # the new registry served it
        assert not old.closed and old.active == 1  # the long run holds the old one open

        hold.set()
        await conn.wait_end("long")
        assert long_run.ends[0].ok
        assert long_run.text == fake_openai.requests[0].response.decode()
        assert fake_openai.requests[0].headers["x-rev"] == "old"
        async with asyncio.timeout(5):
            await old.wait_closed()
        assert not new.closed


async def test_refresh_with_an_unusable_provider_is_acked_not_ok_and_others_keep_working(
    fake_openai, tmp_path, monkeypatch
):
    monkeypatch.delenv("ABSENT_PROVIDER_KEY", raising=False)
    first = node_payload(openai_provider(fake_openai.url, pid="p1"))
    broken = openai_provider(
        fake_openai.url,
        pid="p2",
        auth=wire.AuthPayload(type="bearer"),
        credential=wire.SecretRefPayload(env="ABSENT_PROVIDER_KEY"),
    )
    second = node_payload(openai_provider(fake_openai.url, pid="p1"), broken)
    async with FakeEdge(first) as edge, running_node(edge, tmp_path):
        conn = await edge.next_connection()
        await conn.send(wire.ConfigRefresh(payload=second))
        ack = await conn.next_of(wire.ConfigRefreshAck)
        assert ack.revision == second.revision and not ack.ok
        assert ack.error == "provider p2: environment variable ABSENT_PROVIDER_KEY is not set"
        await conn.tunnel("a", "p1", "chat_completions", chat_body())
        await conn.tunnel("b", "p2", "chat_completions", chat_body())
        a, b = await conn.wait_end("a"), await conn.wait_end("b")
        assert a.ends[0].ok
        assert b.ends[0].error is not None and b.ends[0].error.code == "upstream_error"


async def test_registry_drain_and_close_waits_for_active_runs():
    registry = Registry(node_payload())
    registry.begin_run()
    closing = asyncio.create_task(registry.drain_and_close())
    await asyncio.sleep(0)  # let it start waiting
    assert not closing.done() and not registry.closed
    registry.end_run()
    async with asyncio.timeout(5):
        await closing
    assert registry.closed


async def test_same_revision_keeps_the_current_registry():
    registries = Registries()
    payload = node_payload()
    first = registries.install(payload)
    assert registries.install(payload) is first
    await registries.aclose()
    assert first.closed


def test_unknown_adapter_kind_makes_only_that_provider_unusable():
    odd = wire.ProviderPayload(id="odd", label="odd", adapter="telepathy", driver="none")
    registry = Registry(node_payload(odd))
    assert registry.errors == {"odd": "provider odd: unknown adapter 'telepathy'"}
