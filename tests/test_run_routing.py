"""Runs between Edges over Redis (R-SCALE-2): two hubs in one process act as two Edges.

Edge A has the lease; the Node ``node-a`` is connected to Edge B (a fake transport stands for
its websocket). Real Redis, a random key prefix per test. The Edges' ``{P}:alive:{id}`` keys
are written here (the pool engine renews them in production).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from catalog.config import load_snapshot
from nodes import wire
from nodes.envelope import SlotGrant
from nodes.hub import NodeHub, NodeSession, NodeUnavailable
from nodes.remote import NO_FENCE, REMOTE_WINDOW_CHARS, RelayUnavailable, RunRouter
from nodes.remote_wire import Output
from nodes.runs import RunOrder
from pool.engine import Lease, ProviderPool
from pool.policy import policy_from_snapshot
from tests.support.config_examples import example_document
from tests.support.processes import free_port
from tests.support.routing import FrameLog, read_all, until

REDIS_URL = os.environ.get("IOP_TEST_REDIS_URL", "")
pytestmark = pytest.mark.skipif(
    not REDIS_URL, reason="needs a real Redis: set IOP_TEST_REDIS_URL=redis://127.0.0.1:6379/0"
)
TTL_S = 1.0  # short, so a dead Edge or a lost Redis is noticed quickly in these tests
LEASE = Lease(request_id=1, node_id="node-a", provider_id="cli-a", model="echo", long=False)
CHAT = b'{"model":"echo","messages":[{"role":"user","content":"hi"}]}'


def order(body: bytes = CHAT, **kw: object) -> RunOrder:
    fields: dict = {"tunnel": False, "operation": "chat_completions", "stream": True, "body": body}
    return RunOrder(**(fields | kw))


@dataclass
class Edges:
    redis: aioredis.Redis
    prefix: str
    a: NodeHub
    b: NodeHub
    router_a: RunRouter
    router_b: RunRouter
    node: FrameLog  # what Edge B sent to the Node
    session: NodeSession

    async def alive(self, edge_id: str, ttl_s: float = 60.0) -> None:
        await self.redis.set(f"{self.prefix}:alive:{edge_id}", NO_FENCE, px=int(ttl_s * 1000))

    async def from_node(self, message: wire.NodeToEdge) -> None:
        await self.b.receive(self.session, wire.encode(message))

    async def run_request(self) -> wire.RunRequest | wire.TunnelRequest:
        await until(lambda: self.node.runs(), "the run reached the Node")
        return self.node.runs()[-1]


def hub() -> NodeHub:
    snapshot = load_snapshot(example_document())
    return NodeHub(lambda: snapshot, ProviderPool(policy_from_snapshot(snapshot)))


@contextlib.asynccontextmanager
async def two_edges(url: str) -> AsyncIterator[Edges]:
    client = aioredis.Redis.from_url(url)
    prefix = f"iop-test-runs-{secrets.token_hex(4)}"
    a, b = hub(), hub()
    fast = {"ttl_s": TTL_S, "read_block_ms": 200}
    router_a = RunRouter(url, prefix=prefix, edge_id="edge-a", local=a, **fast)
    router_b = RunRouter(url, prefix=prefix, edge_id="edge-b", local=b, **fast)
    a.remote, b.remote = router_a, router_b
    node = FrameLog()
    session = await b.connect("node-a", node)
    await b.receive(
        session, wire.encode(wire.Register(node_id="node-a", protocol=wire.PROTOCOL_VERSION))
    )
    response = node.sent[-1]
    assert isinstance(response, wire.RegisterResponse)
    ready = wire.Ready(generation=response.generation, revision=response.payload.revision)
    await b.receive(session, wire.encode(ready))
    edges = Edges(client, prefix, a, b, router_a, router_b, node, session)
    await edges.alive("edge-a")
    await edges.alive("edge-b")
    await client.hset(
        f"{prefix}:node:node-a", mapping={"edge": "edge-b", "fence": NO_FENCE, "gen": 1}
    )
    await router_a.start()
    await router_b.start()
    try:
        yield edges
    finally:
        await router_a.aclose()
        await router_b.aclose()
        await a.aclose()
        await b.aclose()
        with contextlib.suppress(RedisError):
            async for key in client.scan_iter(match=f"{prefix}:*"):
                await client.delete(key)
        await client.aclose()


@pytest.fixture
async def edges() -> AsyncIterator[Edges]:
    async with two_edges(REDIS_URL) as edges:
        yield edges


async def test_a_streamed_run_requested_on_one_edge_reaches_the_node_on_another_r_scale_2(edges):
    """R-SCALE-2: the order crosses, the output comes back in order and ends with usage."""
    channel = await edges.a.open_run(LEASE, order(), window=0)
    request = await edges.run_request()
    assert isinstance(request, wire.RunRequest)
    assert (request.run_id, request.provider_id, request.stream) == (channel.run_id, "cli-a", True)
    assert json.loads(bytes(request.body)) == json.loads(CHAT)
    assert request.credit == REMOTE_WINDOW_CHARS  # a run without a window is still bounded
    for n in range(5):
        await edges.from_node(wire.RunEvent(run_id=request.run_id, data=f"data: {n}\n\n"))
    usage = wire.Usage(input_tokens=3, output_tokens=5)
    await edges.from_node(wire.RunEnd(run_id=request.run_id, ok=True, usage=usage))
    text, end = await read_all(channel)
    assert text == "".join(f"data: {n}\n\n" for n in range(5))
    assert end.ok and end.usage == usage
    edges.a.close_run(channel)
    assert channel not in edges.a.open_channels


async def test_a_routed_run_carries_its_request_id_and_trace_context_r_obs_1(edges):
    """R-OBS-1, R-OBS-2: the request id and traceparent cross Redis into the Node's message."""
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    channel = await edges.a.open_run(
        LEASE, order(request_id="req-routed-1", traceparent=traceparent), window=0
    )
    request = await edges.run_request()
    assert (request.request_id, request.traceparent) == ("req-routed-1", traceparent)
    edges.a.close_run(channel)


async def test_closing_a_routed_run_cancels_it_on_the_node_r_scale_2(edges):
    channel = await edges.a.open_run(LEASE, order(), window=0)
    request = await edges.run_request()
    edges.a.close_run(channel)
    await until(lambda: edges.node.cancelled(request.run_id), "the cancel reached the Node")
    assert request.run_id not in edges.session.runs


async def test_output_in_flight_between_edges_stays_within_the_runs_window_r_scale_2(edges):
    """R-SCALE-2, R-IN-5: with a 100-character window the owner Edge relays 100 characters,
    then holds the Node's next 100 until the requester's client has read the first."""
    channel = await edges.a.open_run(LEASE, order(), window=100)
    request = await edges.run_request()
    assert request.credit == 100
    for _ in range(4):
        await edges.from_node(wire.RunEvent(run_id=request.run_id, data="x" * 25))
    await until(lambda: channel.outstanding == 100, "the first window reached Edge A")
    await until(lambda: edges.node.credit(request.run_id) == 100, "Edge B gave the Node room")
    for _ in range(4):
        await edges.from_node(wire.RunEvent(run_id=request.run_id, data="y" * 25))
    await until(lambda: edges.router_b.held_back() == 1, "the second window waits on Edge B")
    assert edges.session.runs[request.run_id].outstanding == 100
    assert channel.outstanding == 100 and not channel.finished  # nothing overran
    await edges.from_node(wire.RunEnd(run_id=request.run_id, ok=True))
    text, end = await read_all(channel, release=True)
    assert text == "x" * 100 + "y" * 100
    assert end.ok


async def test_output_larger_than_the_room_left_is_split_at_the_credit_r_scale_2(edges):
    """R-SCALE-2, R-IN-5: the owner forwards what fits the requester's credit and the rest
    when more comes, as a Node splits at its credit: a large event never waits for credit
    that only its own delivery would bring back."""
    channel = await edges.a.open_run(LEASE, order(), window=100)
    request = await edges.run_request()
    await edges.from_node(wire.RunEvent(run_id=request.run_id, data="x" * 50))
    await until(lambda: channel.outstanding == 50, "the first half reached Edge A")
    await edges.from_node(wire.RunEvent(run_id=request.run_id, data="x" * 50))
    await until(lambda: channel.outstanding == 100, "the second half reached Edge A")
    await until(lambda: edges.node.credit(request.run_id) == 100, "Edge B gave the Node room")
    await edges.from_node(wire.RunEvent(run_id=request.run_id, data="y" * 100))
    await until(lambda: edges.router_b.held_back() == 1, "the large event waits on Edge B")
    assert await channel.get() == "x" * 50
    channel.release()  # 50 characters read by the client: credit for 50
    await until(lambda: channel.outstanding == 100, "the part that fits came")
    assert [await channel.get(), await channel.get()] == ["x" * 50, "y" * 50]
    channel.release()
    await edges.from_node(wire.RunEnd(run_id=request.run_id, ok=True))
    text, end = await read_all(channel, release=True)
    assert text == "y" * 50 and end.ok


async def test_a_large_body_and_forwarded_headers_cross_in_parts_r_scale_2(edges):
    """R-SCALE-2, R-IN-2: a body over the split size reaches the Node whole, in parts."""
    text = "z" * (3 * wire.SPLIT_BODY_BYTES)
    body = json.dumps({"model": "chat-model", "messages": [{"role": "user", "content": text}]})
    lease = Lease(request_id=2, node_id="node-a", provider_id="compat-a", model="m", long=False)
    headers = (("authorization", "Bearer caller"),)
    spec = order(body.encode(), tunnel=True, forward_headers=headers)
    channel = await edges.a.open_run(lease, spec, window=0)
    request = await edges.run_request()
    assert isinstance(request, wire.TunnelRequest)
    assert request.forward_headers == {"authorization": "Bearer caller"}
    parts = [m.data for m in edges.node.sent if isinstance(m, wire.RunBodyPart)]
    assert request.body_parts == len(parts) > 1
    assert "".join(parts) == body
    edges.a.close_run(channel)


async def test_the_owner_edge_dying_fails_the_run_with_node_gone_r_scale_2(edges):
    """R-SCALE-2: the owner stops answering and its alive key expires: node_gone on A within
    the alive TTL plus one check."""
    channel = await edges.a.open_run(LEASE, order(), window=0)
    await edges.run_request()
    await edges.router_b.aclose()  # stops reading: nothing more comes from Edge B
    await edges.redis.delete(f"{edges.prefix}:alive:edge-b")
    async with asyncio.timeout(TTL_S + edges.router_a.check_s + 2):
        _, end = await read_all(channel)
    assert not end.ok and end.error is not None and end.error.code == "node_gone"


async def test_an_order_the_owner_never_takes_fails_retryably_with_node_gone_r_scale_2(edges):
    """R-SCALE-2: Edge B is alive but does not read its orders: within its TTL plus a check
    the run ends with node_gone, marked as not started, so another provider may take it."""
    await edges.router_b.aclose()  # alive key kept: B is up, its router is not
    channel = await edges.a.open_run(LEASE, order(), window=0)
    async with asyncio.timeout(TTL_S + edges.router_a.check_s + 2):
        _, end = await read_all(channel)
    assert end.error is not None and end.error.code == "node_gone"
    assert end.error.before_first_byte


async def test_the_requesting_edge_dying_cancels_the_run_on_the_node_r_scale_2(edges):
    await edges.a.open_run(LEASE, order(), window=0)
    request = await edges.run_request()
    await edges.router_a.aclose()
    await edges.alive("edge-a", ttl_s=0.2)  # not renewed any more: it expires
    await until(
        lambda: edges.node.cancelled(request.run_id), "the Node's run was cancelled", within=5
    )


async def test_a_requester_whose_id_was_taken_over_has_its_run_cancelled_r_scale_4(edges):
    """R-SCALE-4: Edge A's id is taken by a newer process (its alive key holds another fence)
    while A's routed run streams on B's Node: B cancels it as for a dead Edge, and a late
    order of the old process is refused (nothing reaches the Node)."""
    await edges.a.open_run(LEASE, order(), window=0)
    request = await edges.run_request()
    await edges.redis.set(f"{edges.prefix}:alive:edge-a", "2", px=60_000)  # a newer fence
    await until(
        lambda: edges.node.cancelled(request.run_id), "the Node's run was cancelled", within=5
    )
    runs = len(edges.node.runs())
    late = Lease(request_id=8, node_id="node-a", provider_id="cli-a", model="m", long=False)
    channel = await edges.a.open_run(late, order(), window=0)
    async with asyncio.timeout(5):
        _, end = await read_all(channel)
    assert end.error is not None and end.error.code == "node_gone"
    assert len(edges.node.runs()) == runs


async def test_a_node_held_by_no_live_edge_is_unavailable_r_scale_2(edges):
    other = Lease(request_id=3, node_id="node-zzz", provider_id="cli-a", model="m", long=False)
    with pytest.raises(NodeUnavailable):
        await edges.a.open_run(other, order())
    await edges.redis.delete(f"{edges.prefix}:alive:edge-b")
    with pytest.raises(NodeUnavailable):
        await edges.a.open_run(LEASE, order())
    assert edges.node.runs() == []


async def test_a_node_gone_from_its_edge_ends_the_run_with_a_retryable_node_gone(edges):
    """R-SCALE-2: the Node's hash still names Edge B but the Node left it: nothing ran, so
    the request may try another provider."""
    await edges.b.disconnect(edges.session)
    channel = await edges.a.open_run(LEASE, order(), window=0)
    _, end = await read_all(channel)
    assert end.error is not None and end.error.code == "node_gone"
    assert end.error.before_first_byte


async def test_a_managed_run_is_sealed_by_the_edge_holding_the_node_r_scale_7(edges):
    """R-SCALE-7: the requester never seals (it does not know the Node's generation); the
    order carries the slot grant and Edge B issues the envelope with its own generation.
    Without a grant a managed run is not routed."""

    def never(run_id: str, node_id: str, generation: int) -> dict:
        raise AssertionError("the requester never seals a routed run")

    with pytest.raises(NodeUnavailable, match="grant"):
        await edges.a.open_run(LEASE, order(seal=never))
    issued: list[tuple[SlotGrant, str, str, str, int]] = []

    def issuer(grant: SlotGrant, provider_id: str):
        def seal(run_id: str, node_id: str, generation: int) -> dict:
            issued.append((grant, provider_id, run_id, node_id, generation))
            return {"sealed-for": node_id, "generation": generation}

        return seal

    edges.router_b.issuer = issuer
    grant = SlotGrant("slot-1", 3, 7, "v1:k1:opaque")
    channel = await edges.a.open_run(LEASE, order(seal=never, grant=grant), window=0)
    request = await edges.run_request()
    generation = edges.session.generation
    assert issued == [(grant, "cli-a", channel.run_id, "node-a", generation)]
    assert request.lease_envelope == {"sealed-for": "node-a", "generation": generation}
    await edges.from_node(wire.RunEnd(run_id=request.run_id, ok=True))
    await read_all(channel)


async def test_a_managed_run_routed_to_an_edge_that_cannot_seal_ends_credential_refused(edges):
    """R-SCALE-7: Edge B without managed mode (or unable to open the slot) refuses the run
    before anything reaches the Node, as a Node refuses a bad envelope."""

    def seal(run_id: str, node_id: str, generation: int) -> dict:
        raise AssertionError("the requester never seals a routed run")

    grant = SlotGrant("slot-1", 3, 7, "v1:k1:opaque")
    channel = await edges.a.open_run(LEASE, order(seal=seal, grant=grant), window=0)
    _, end = await read_all(channel)
    assert end.error is not None and end.error.code == "credential_refused"
    assert edges.node.runs() == []


async def test_redis_unreachable_refuses_a_routed_run_at_once(edges):
    hub_c = hub()
    router = RunRouter("redis://127.0.0.1:1/0", prefix=edges.prefix, edge_id="edge-c", local=hub_c)
    hub_c.remote = router
    try:
        with pytest.raises(RelayUnavailable):
            await hub_c.open_run(LEASE, order())
    finally:
        await router.aclose()


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
async def test_redis_going_away_mid_run_ends_the_run_with_relay_unavailable_r_scale_2():
    """R-SCALE-2: a run in flight when Redis dies ends with a clear code; nothing hangs."""
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        *("redis-server", "--port", str(port), "--save", "", "--appendonly", "no"),
        stdout=asyncio.subprocess.DEVNULL,
    )
    try:
        url = f"redis://127.0.0.1:{port}/0"
        probe = aioredis.Redis.from_url(url)
        await until_answers(probe)
        await probe.aclose()
        async with two_edges(url) as edges:
            channel = await edges.a.open_run(LEASE, order(), window=0)
            await edges.run_request()
            server.kill()
            await server.wait()
            router = edges.router_a
            async with asyncio.timeout(router.lost_after_s + router.check_s + 2):
                _, end = await read_all(channel)
            assert end.error is not None and end.error.code == "relay_unavailable"
            with pytest.raises(RelayUnavailable):
                await edges.a.open_run(LEASE, order())
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
async def test_redis_restarted_empty_mid_run_ends_the_run_with_relay_unavailable_r_scale_2():
    """R-SCALE-2: Redis back on the same port at once, but what was sent meanwhile (and the
    streams) is lost: the run still ends with a clear code instead of waiting forever."""
    port = free_port()

    async def redis_server() -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *("redis-server", "--port", str(port), "--save", "", "--appendonly", "no"),
            stdout=asyncio.subprocess.DEVNULL,
        )

    server = await redis_server()
    try:
        url = f"redis://127.0.0.1:{port}/0"
        probe = aioredis.Redis.from_url(url)
        await until_answers(probe)
        async with two_edges(url) as edges:
            channel = await edges.a.open_run(LEASE, order(), window=0)
            await edges.run_request()
            server.kill()
            await server.wait()
            server = await redis_server()  # empty, before the silence bound
            await until_answers(probe)
            await until_answers(edges.redis)
            await edges.alive("edge-a")  # as the pool engines re-assert them
            await edges.alive("edge-b")
            router = edges.router_a
            async with asyncio.timeout(router.lost_after_s + router.check_s + 2):
                _, end = await read_all(channel)
            assert end.error is not None and end.error.code == "relay_unavailable"
        await probe.aclose()
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()


async def test_output_the_owner_could_not_relay_ends_the_run_on_the_requester_r_scale_2(
    edges, monkeypatch
):
    """R-SCALE-2: one relay send fails (a connection gone stale in a Redis restart) while
    both Edges live on: the requester hears that the run ended instead of waiting for ever."""
    owner = edges.router_b._owner  # the owning Edge's side sends the output
    send = owner._send
    failed: list[tuple[str, str]] = []

    async def flaky(to: tuple[str, str], kind: str, *messages: Any) -> None:
        if not failed and any(isinstance(m, Output) for m in messages):
            failed.append(to)
            raise RedisConnectionError("Connection closed by server.")
        await send(to, kind, *messages)

    monkeypatch.setattr(owner, "_send", flaky)
    channel = await edges.a.open_run(LEASE, order(), window=0)
    request = await edges.run_request()
    await edges.from_node(wire.RunEvent(run_id=request.run_id, data="lost"))
    async with asyncio.timeout(5):
        text, end = await read_all(channel)
    assert failed == [("edge-a", NO_FENCE)] and text == ""
    assert end.error is not None and end.error.code == "relay_unavailable"
    await until(lambda: edges.node.cancelled(request.run_id), "the run cancelled on the Node")


async def test_a_send_failing_after_the_read_loop_failed_every_run_is_a_relay_unavailable(
    edges, monkeypatch
):
    """R-HA-1: a primary killed under load; the read loop loses Redis and fails every run
    while an order's send is still waiting, then that send fails too. The request gets 503
    ``pool_unavailable`` (``RelayUnavailable``), not a 500 (the run was already gone from
    the table: tests/test_scale_sentinel_e2e.py met it about once in 30 runs)."""
    router = edges.router_a

    async def lost(to: tuple[str, str], kind: str, *messages: Any) -> None:
        router._fail_all("relay_unavailable", "run routing between Edges lost Redis")
        raise RedisConnectionError("Error while reading: Connection reset by peer")

    monkeypatch.setattr(router, "_send", lost)
    with pytest.raises(RelayUnavailable):
        await edges.a.open_run(LEASE, order())
    assert router._requested == {}


async def until_answers(client: aioredis.Redis) -> None:
    async def answers() -> bool:
        with contextlib.suppress(RedisError):
            return bool(await client.ping())
        return False

    for _ in range(500):
        if await answers():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the test's redis-server did not answer")
