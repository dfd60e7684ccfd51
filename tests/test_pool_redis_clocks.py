"""Leases do not depend on Edge clocks agreeing (R-SCALE-2, docs/scale-out.md): every lease
expiry is decided on Redis ``TIME``, so two Edges whose clocks are two hours apart still keep a
renewed lease and free a dead Edge's lease after its TTL. (The queue timeout on Redis time is
in tests/test_pool_redis.py.)"""

from __future__ import annotations

import asyncio

from tests.support.pools import prov
from tests.support.redis_pool import crash, edges, needs_redis, policy, queued

pytestmark = needs_redis
TTL = 0.6
HOUR = 3600.0


def skewed(seconds: float):  # type: ignore[no-untyped-def]
    return lambda: asyncio.get_running_loop().time() + seconds


async def test_r_scale_2_edges_with_clocks_hours_apart_keep_and_free_leases_on_redis_time() -> None:
    async with edges() as group:
        pol = policy(prov("p1", cap=1))
        ahead = await group.start(pol, "edge-ahead", ttl=TTL, clock=skewed(HOUR))
        behind = await group.start(pol, "edge-behind", ttl=TTL, clock=skewed(-HOUR))
        behind.node_ready("n1", 1)  # the Node outlives the lease holder
        held = await ahead.acquire("m")
        waiting = asyncio.create_task(behind.acquire("m"))
        await queued(behind, 1)
        # Five TTLs on the Edge clocks' own scale: the renewed lease is never taken away.
        done, _ = await asyncio.wait({waiting}, timeout=5 * TTL)
        assert not done and (await behind.fetch_snapshot()).queue_depth == 1
        await crash(ahead)  # no more renewals: the lease ends by Redis time alone
        lease = await asyncio.wait_for(waiting, 10)
        assert lease.provider_id == "p1" and held.request_id != lease.request_id
        behind.release(lease)
