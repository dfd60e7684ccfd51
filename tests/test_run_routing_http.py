"""A request on one Edge answered by a Node on another, through the public API (R-SCALE-2).

Edge A serves ``/v1`` (OpenAIApp in process) with a pool that sees the Node ready, as the
shared pool does; the Node (a scripted one) is connected to Edge B's hub. Real Redis.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from nodes.remote import NO_FENCE, RunRouter
from pool.http.app import OpenAIApp
from tests.support.inprocess import FakeNode, Runtime, api, chat, document
from tests.support.ports import free_port
from tests.support.routing import until

REDIS_URL = os.environ.get("IOP_TEST_REDIS_URL", "")
pytestmark = pytest.mark.skipif(
    not REDIS_URL, reason="needs a real Redis: set IOP_TEST_REDIS_URL=redis://127.0.0.1:6379/0"
)


@pytest.fixture
async def edges() -> AsyncIterator[tuple[OpenAIApp, Runtime, FakeNode]]:
    client = aioredis.Redis.from_url(REDIS_URL)
    prefix = f"iop-test-runs-http-{secrets.token_hex(4)}"
    a, b = Runtime(document()), Runtime(document())
    node = await FakeNode(b.hub).start()
    a.pool.node_ready("n1", 1, {})  # the shared pool's view: the Node is ready (on Edge B)
    routers = [
        RunRouter(REDIS_URL, prefix=prefix, edge_id=f"edge-{n}", local=rt.hub, ttl_s=2.0)
        for n, rt in (("a", a), ("b", b))
    ]
    a.hub.remote, b.hub.remote = routers
    for name in "ab":
        await client.set(f"{prefix}:alive:edge-{name}", NO_FENCE, px=60_000)
    await client.hset(f"{prefix}:node:n1", mapping={"edge": "edge-b", "fence": NO_FENCE, "gen": 1})
    for router in routers:
        await router.start()
    try:
        yield OpenAIApp(a), a, node
    finally:
        for router in routers:
            await router.aclose()
        await a.hub.aclose()
        await b.hub.aclose()
        async for key in client.scan_iter(match=f"{prefix}:*"):
            await client.delete(key)
        await client.aclose()
    assert a.pool.idle(), "every lease released on the requesting Edge (R-POOL-9)"


async def test_a_streamed_chat_on_edge_a_is_answered_by_the_node_on_edge_b_r_scale_2(
    edges: Any,
) -> None:
    app, runtime, node = edges
    call = await api(app, "POST", "/v1/chat/completions", chat(stream=True)).done()
    assert call.status == 200
    assert call.body == b"data: one\n\ndata: two\n\n"
    assert node.runs[0].stream
    (record,) = runtime.meter.records  # metered once, on the Edge that took the request
    assert (record.provider_id, record.input_tokens, record.output_tokens) == ("p-open", 3, 2)


async def test_a_non_stream_chat_crosses_edges_whole_r_scale_2(edges: Any) -> None:
    app, _, node = edges
    call = await api(app, "POST", "/v1/chat/completions", chat()).done()
    assert call.status == 200 and call.body == b'{"ok":true}'
    assert not node.runs[0].stream


async def test_a_client_leaving_cancels_the_run_on_the_other_edges_node_r_scale_2(
    edges: Any,
) -> None:
    app, _, node = edges

    async def hold(node: FakeNode, run: Any) -> None:
        await node.emit(run.run_id, "data: one\n\n")
        await node.release.wait()

    node.script = hold
    call = api(app, "POST", "/v1/chat/completions", chat(stream=True))
    await call.wait_for(lambda: b"data: one" in call.body)
    call.disconnect()
    await call.done()
    await until(lambda: node.cancelled == [node.runs[0].run_id], "the cancel reached the Node")


async def test_redis_unreachable_while_routing_is_a_503_pool_unavailable_r_scale_2() -> None:
    """The run's Node is on another Edge and Redis does not answer: the client gets the
    same answer as an admission while Redis is away, never a misleading one."""
    runtime = Runtime(document())
    runtime.pool.node_ready("n1", 1, {})  # the shared pool's view: the Node is on Edge B
    router = RunRouter(
        f"redis://127.0.0.1:{free_port()}/0", prefix="iop-test-x", edge_id="edge-a",
        local=runtime.hub, ttl_s=2.0,
    )  # fmt: skip
    runtime.hub.remote = router
    try:
        call = await api(OpenAIApp(runtime), "POST", "/v1/chat/completions", chat()).done()
    finally:
        await router.aclose()
        await runtime.hub.aclose()
    assert call.status == 503 and call.headers[b"retry-after"] == b"1"
    assert json.loads(call.body)["error"]["code"] == "pool_unavailable"
    assert runtime.pool.idle(), "the lease was released (R-POOL-9)"
