"""A lease outlives its Edge's alive key (R-SCALE-2, R-POOL-9, docs/pool.md "Periods and
TTLs"): when an Edge dies, the Edge serving its routed run cancels it on the Node once the alive
key is gone (within TTL/3, docs/scale-out.md), and only after that is the capacity free, so the
upstream never serves more than capacity."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from tests.support.pools import prov
from tests.support.redis_pool import REDIS_URL, crash, edges, needs_redis, policy

pytestmark = needs_redis
TTL = 0.6


async def test_r_scale_2_a_lease_expires_more_than_ttl_3_after_its_edges_alive_key() -> None:
    async with edges() as group:
        pol = policy(prov("p1", cap=1))
        a = await group.start(pol, "edge-a", ttl=TTL)
        b = await group.start(pol, "edge-b", ttl=TTL)
        b.node_ready("n1", 1)
        held = await a.acquire("m")
        client = aioredis.Redis.from_url(REDIS_URL)
        try:
            for _ in range(5):  # across renewals: both are written by one script, read at once
                async with client.pipeline(transaction=True) as pipe:
                    pipe.time()
                    pipe.pttl(f"{group.prefix}:alive:edge-a")
                    pipe.zscore(f"{group.prefix}:leases", str(held.request_id))
                    (sec, usec), alive_ms, lease_at = await pipe.execute()
                alive_until = sec * 1000 + usec // 1000 + alive_ms
                assert lease_at - alive_until > TTL / 3 * 1000
                await asyncio.sleep(TTL / 3)  # sample a later renewal
        finally:
            await client.aclose()
        waiting = asyncio.create_task(b.acquire("m"))
        await crash(a)
        lease = await asyncio.wait_for(waiting, 10)  # and the dead Edge's lease does end
        b.release(lease)
