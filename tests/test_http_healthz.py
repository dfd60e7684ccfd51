"""``GET /healthz`` on the public listener: what a load balancer in front of several Edges
asks (docs/scale-out.md). No token, one word, 503 when this Edge should get no new request."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pool.engine_redis import RedisPool
from pool.http.app import OpenAIApp
from pool.http.metrics import PoolCollector
from pool.policy import policy_from_snapshot
from tests.support.inprocess import Runtime, api, chat, document
from tests.support.redis_pool import OwnRedis

needs_redis_server = pytest.mark.skipif(
    shutil.which("redis-server") is None, reason="redis-server is not installed"
)


async def test_healthz_answers_ok_without_a_token() -> None:
    app = OpenAIApp(Runtime(document()))
    call = await api(app, "GET", "/healthz", token=None).done()
    assert call.status == 200 and json.loads(call.body) == {"status": "ok"}
    assert call.headers[b"cache-control"] == b"no-store"
    head = await api(app, "HEAD", "/healthz", token=None).done()
    assert head.status == 200 and head.body == b""


async def test_healthz_is_503_draining_while_the_edge_stops() -> None:
    runtime = Runtime(document())
    runtime.draining = True
    call = await api(OpenAIApp(runtime), "GET", "/healthz", token=None).done()
    assert call.status == 503 and json.loads(call.body) == {"status": "draining"}


async def test_healthz_refuses_other_methods() -> None:
    call = await api(OpenAIApp(Runtime(document())), "POST", "/healthz", token=None).done()
    assert call.status == 405


@needs_redis_server
async def test_healthz_is_503_while_the_shared_pool_cannot_be_reached_r_scale_2(
    tmp_path: Path,
) -> None:
    """The Edge's Redis (a redis-server of the test's own) goes away after the start: the
    request is a 503 ``pool_unavailable``, the health check says so and ``iop_pool_reachable``
    is 0."""
    runtime: Any = Runtime(document())
    server = OwnRedis(tmp_path)
    server.start()
    pool = RedisPool(
        policy_from_snapshot(runtime.snapshot),
        redis_url=server.url,
        prefix="iop-test-healthz",
        edge_id="edge-h",
        lease_ttl_s=1.0,
    )
    runtime.pool = pool
    try:
        await pool.start()
        server.kill()
        app = OpenAIApp(runtime)
        refused = await api(app, "POST", "/v1/chat/completions", chat()).done()
        assert refused.status == 503
        assert json.loads(refused.body)["error"]["code"] == "pool_unavailable"
        call = await api(app, "GET", "/healthz", token=None).done()
        assert call.status == 503 and json.loads(call.body) == {"status": "pool_unavailable"}
        (gauge,) = [m for m in PoolCollector(runtime).collect() if m.name == "iop_pool_reachable"]
        assert [sample.value for sample in gauge.samples] == [0.0]
    finally:
        server.kill()
        await pool.aclose()
