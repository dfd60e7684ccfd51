"""What one request costs the Redis engine in round trips (R-SCALE-2; docs/pool.md, "Redis
engine"): an admission is one, and the previous request's end rides with it; a lone end
still reaches Redis on its own."""

from __future__ import annotations

import asyncio
from typing import Any

from pool.engine_redis import RedisPool, background
from pool.engine_redis.link import Command
from tests.support.pools import prov
from tests.support.redis_pool import edges, needs_redis, policy, queued

pytestmark = needs_redis


def record(pool: RedisPool) -> list[list[str]]:
    """The scripts of every round trip ``pool`` makes from now on, in order (a folded
    verdict + release is ``release+``)."""
    trips: list[list[str]] = []
    assert pool._link is not None
    run = pool._link.run

    async def spy(commands: list[Command]) -> list[Any]:
        trips.append([name + ("+" if argv[5:6] == ["+"] else "") for name, argv in commands])
        return await run(commands)

    pool._link.run = spy  # type: ignore[method-assign]
    return trips


async def test_r_pool_9_a_requests_end_rides_with_the_next_admission_in_one_round_trip() -> None:
    """R-POOL-9, R-HEALTH-2: at c=1 a request is one round trip: its admission, with the
    previous request's verdict and release folded into one script ahead of it."""
    async with edges() as group:
        a = await group.start(policy(prov("p1", cap=1)), "edge-a")
        a.node_ready("n1", 1)
        await a.flush()
        first = await a.acquire("m")
        trips = record(a)
        a.succeeded(first)
        assert a.release(first) is True
        for _ in range(2):  # the writer's turn, as between two requests: nothing to send yet
            await asyncio.sleep(0)
        second = await a.acquire("m")  # capacity 1: only free once the release ran first
        assert trips == [["release+", "admit"]]
        assert second.provider_id == "p1"
        snap = await a.fetch_snapshot()
        assert snap.providers[0].in_flight == 1
        assert snap.providers[0].health == "healthy"
        a.release(second)


async def test_r_pool_9_a_lone_release_reaches_redis_with_no_other_call() -> None:
    """R-POOL-9, R-POOL-5: nothing follows edge-a's release: it is sent on its own (within
    ``HOLD_S``) and edge-b's waiter gets the capacity."""
    async with edges() as group:
        a, b, held = await group.one_slot_held()
        waiting = asyncio.create_task(b.acquire("m"))
        await queued(b, 1)
        trips = record(a)
        a.release(held)
        lease = await asyncio.wait_for(waiting, 5)
        assert lease.provider_id == "p1"
        assert trips[0] == ["release"]
        b.release(lease)


async def test_r_pool_5_a_release_is_not_held_while_someone_waits() -> None:
    """R-POOL-5: a lease's end waits for company only when nobody is known to wait: not
    while this Edge has a waiter, nor while its last view shows another Edge's waiter."""
    async with edges() as group:
        a, b, held = await group.one_slot_held()
        own = asyncio.create_task(a.acquire("m"))
        await queued(a, 1)
        a.release(held)
        assert background._only_ends(a) is False  # a's own waiter: sent at once
        held = await asyncio.wait_for(own, 5)
        other = asyncio.create_task(b.acquire("m"))
        await queued(a, 1)  # a's view now shows b's waiter
        assert not a._waiters
        a.release(held)
        assert background._only_ends(a) is False
        b.release(await asyncio.wait_for(other, 5))
        await b.flush()
        last = await a.acquire("m")
        assert (await a.fetch_snapshot()).queue_depth == 0
        a.release(last)
        assert background._only_ends(a) is True  # nobody waits: it may wait for company
