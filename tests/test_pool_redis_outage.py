"""The Redis engine when an Edge dies or Redis goes away (R-SCALE-2/3, R-POOL-9): leases and
Nodes of a silent Edge expire by TTL, an unreachable Redis answers 503 at once, and a Redis
that lost its data never over-admits."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
import redis

from pool.engine import PoolBackendUnavailable, PoolRecovering, QueueTimeout, Unavailable
from pool.engine_redis import scripts
from tests.support.pools import prov
from tests.support.redis_pool import (
    crash,
    edges,
    needs_redis,
    own_redis,
    policy,
    queued,
)

TTL = 0.6


@needs_redis
async def test_r_scale_2_a_renewed_lease_outlives_its_ttl() -> None:
    """A's lease is renewed every TTL/3: B's waiter times out after 2.5 TTLs, never granted."""
    async with edges() as group:
        pol = policy(prov("p1", cap=1), timeout_ms=round(TTL * 2500))
        a = await group.start(pol, "edge-a", ttl=TTL)
        b = await group.start(pol, "edge-b", ttl=TTL)
        a.node_ready("n1", 1)
        held = await a.acquire("m")
        with pytest.raises(QueueTimeout):
            await asyncio.wait_for(b.acquire("m"), 10)
        a.release(held)


@needs_redis
async def test_r_scale_2_leases_of_an_edge_that_stops_renewing_expire() -> None:
    """R-POOL-9 across Edges: the dead Edge's slot comes back after its TTL, and the waiter
    on the live Edge gets it."""
    async with edges() as group:
        pol = policy(prov("p1", cap=1))
        a = await group.start(pol, "edge-a", ttl=TTL)
        b = await group.start(pol, "edge-b", ttl=TTL)
        b.node_ready("n1", 1)
        await a.acquire("m")
        waiting = asyncio.create_task(b.acquire("m"))
        await queued(b, 1)
        await crash(a)
        lease = await asyncio.wait_for(waiting, 10)
        assert lease.provider_id == "p1"
        b.release(lease)


@needs_redis
async def test_r_scale_2_waiters_and_nodes_of_a_dead_edge_are_dropped() -> None:
    async with edges() as group:
        pol = policy(prov("p1", cap=1, node="n1"), prov("p2", cap=1, node="n2"))
        a = await group.start(pol, "edge-a", ttl=TTL)
        b = await group.start(pol, "edge-b", ttl=TTL)
        a.node_ready("n1", 1)
        b.node_ready("n2", 1)
        leases = [await b.acquire("m"), await b.acquire("m")]
        waiting = asyncio.create_task(a.acquire("m", exclude=frozenset({"p2"})))
        b_waiting = asyncio.create_task(b.acquire("m", exclude=frozenset({"p2"})))
        await queued(b, 2)
        await crash(a)
        # n1 was A's: it expires, B's waiter that only p1 could serve fails (R-POOL-6)
        with pytest.raises(Unavailable):
            await asyncio.wait_for(b_waiting, 10)
        snap = await b.fetch_snapshot()
        assert snap.queue_depth == 0  # A's waiter went with A
        assert [r.online for r in snap.providers] == [False, True]
        waiting.cancel()
        for lease in leases:
            b.release(lease)


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server to kill")
async def test_r_scale_3_unreachable_redis_is_a_503_at_once_and_data_loss_never_over_admits(
    tmp_path: Path,
) -> None:
    """Redis dies: admissions and waiters fail with ``pool_unavailable``. It comes back
    empty: admissions answer ``pool_recovering`` until the Edges re-asserted their leases,
    then capacity still holds the lease taken before the loss."""
    with own_redis(tmp_path) as server:
        async with edges(server.url) as group:
            pol = policy(prov("p1", cap=1))
            a = await group.start(pol, "edge-a", ttl=1.0)
            b = await group.start(pol, "edge-b", ttl=1.0)
            a.node_ready("n1", 1)
            held = await a.acquire("m")
            waiting = asyncio.create_task(b.acquire("m"))
            await queued(b, 1)
            server.kill()
            with pytest.raises(PoolBackendUnavailable):
                await asyncio.wait_for(waiting, 10)
            with pytest.raises(PoolBackendUnavailable):
                await a.acquire("m")
            server.start()  # empty: no epoch, no lease, no Node, no policy
            recovering = 0
            for _ in range(1000):
                task = asyncio.create_task(b.acquire("m"))
                await asyncio.sleep(0)
                if not task.done():
                    await b.flush()
                    await asyncio.sleep(0)
                if not task.done():
                    break  # queued: admissions are open again
                exc = task.exception()
                assert exc is not None, f"over-admitted {task.result()} while {held} is held"
                assert isinstance(exc, (PoolRecovering, PoolBackendUnavailable))
                recovering += isinstance(exc, PoolRecovering)
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("admissions never opened again")
            assert recovering > 0
            snap = await a.fetch_snapshot()
            row = snap.providers[0]
            assert (row.online, row.in_flight, snap.queue_depth) == (True, 1, 1)
            a.release(held)
            lease = await asyncio.wait_for(task, 10)
            b.release(lease)


@needs_redis
async def test_r_pool_5_a_grant_whose_message_is_lost_is_found_at_the_next_renewal() -> None:
    """B does not hear A's PUBLISH (its listener is gone): B's renewal reads the waiter's
    hash and the waiter still gets its lease."""
    async with edges() as group:
        pol = policy(prov("p1", cap=1))
        a = await group.start(pol, "edge-a", ttl=TTL)
        b = await group.start(pol, "edge-b", ttl=TTL)
        a.node_ready("n1", 1)
        held = await a.acquire("m")
        waiting = asyncio.create_task(b.acquire("m"))
        await queued(a, 1)
        listener = next(t for t in b._tasks if t.get_name() == "pool-listener")
        listener.cancel()
        a.release(held)
        lease = await asyncio.wait_for(waiting, 10)
        assert lease.provider_id == "p1"
        b.release(lease)


@needs_redis
async def test_r_health_2_an_ejection_ends_by_the_sweep_when_the_ejecting_edge_died() -> None:
    """A ejected p1 and died before its health timer fired: B's sweep starts p1's trial."""
    async with edges() as group:
        pol = policy(prov("p1", cap=2))
        a = await group.start(pol, "edge-a", ttl=TTL)
        b = await group.start(pol, "edge-b", ttl=TTL)
        b.node_ready("n1", 1)
        lease = await a.acquire("m")
        a.failed(lease, "upstream answered HTTP 429", retry_after_s=1.0)
        a.release(lease)
        await a.flush()
        await crash(a)
        with pytest.raises(Unavailable, match="ejected"):
            await b.acquire("m")
        for _ in range(200):
            if (await b.fetch_snapshot()).providers[0].health == "probing":
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("p1 never got its trial")
        trial = await b.acquire("m")
        waiting = asyncio.create_task(b.acquire("m"))  # one trial at a time (R-HEALTH-2)
        await queued(b, 1)
        b.succeeded(trial)
        b.release(trial)
        second = await asyncio.wait_for(waiting, 10)
        assert (await b.fetch_snapshot()).providers[0].health == "healthy"
        b.release(second)


@needs_redis
async def test_r_tls_3_a_provider_its_node_refuses_is_offline_with_the_reason() -> None:
    async with edges() as group:
        pol = policy(prov("p1"), prov("p2"))
        a = await group.start(pol, "edge-a", ttl=TTL)
        b = await group.start(pol, "edge-b", ttl=TTL)
        a.node_ready("n1", 1, {"p1": "tls verification is off"})
        lease = await b.acquire("m")
        assert lease.provider_id == "p2"
        a.node_refused("n1", 1, {"p1": "tls verification is off", "p2": "no route"})
        await a.flush()
        snap = await b.fetch_snapshot()
        assert [(r.online, r.unavailable) for r in snap.providers] == [
            (False, "tls verification is off"),
            (False, "no route"),
        ]
        with pytest.raises(Unavailable):
            await b.acquire("m")
        b.release(lease)


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs a redis-server to flush")
async def test_r_scale_3_scripts_redis_forgot_are_loaded_again_and_each_call_runs_once(
    tmp_path: Path,
) -> None:
    """R-SCALE-3: Redis forgets the scripts (SCRIPT FLUSH, as after a restart): a lone call and
    the calls of one pipeline answer NOSCRIPT, the scripts are loaded again and each refused
    call runs once, in order; a call never asks SCRIPT EXISTS first (docs/pool.md)."""
    with own_redis(tmp_path) as server:  # SCRIPT FLUSH is server-wide: never the shared Redis
        client = redis.Redis.from_url(server.url)
        async with edges(server.url) as group:
            pol = policy(prov("p1", cap=2))
            a = await group.start(pol, "edge-a")
            a.node_ready("n1", 1)
            first = await a.acquire("m")
            client.script_flush()
            second = await a.acquire("m")  # one call: NOSCRIPT, loaded, sent again
            client.script_flush()
            a.release(first)  # the two releases are one pipeline of two calls
            a.release(second)
            await a.flush()
            assert (await a.fetch_snapshot()).providers[0].in_flight == 0
            leases = [await a.acquire("m"), await a.acquire("m")]
            waiting = asyncio.create_task(a.acquire("m"))
            await queued(a, 1)
            assert (await a.fetch_snapshot()).providers[0].in_flight == 2
            stats = client.info("commandstats")
            assert "cmdstat_script|exists" not in stats
            assert stats["cmdstat_script|load"]["calls"] == 3 * len(scripts.NAMES)
            waiting.cancel()
            for lease in leases:
                a.release(lease)
        client.close()
