"""The Redis engine when its server changes under it (R-HA-2, docs/pool.md "Redis engine"): a
promoted replica that missed the last writes is a loss of data (new epoch, grace, every live
Edge re-asserts), capacity holds the leases the replica never saw, and no fence or lease id
is handed out twice. Real redis-server processes of the test's own on free ports."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from pool.engine import PoolBackendUnavailable, PoolRecovering
from tests.support.pools import prov
from tests.support.redis_pool import edges, needs_redis, policy, queued, until
from tests.support.sentinel import Server, in_sync

pytestmark = [
    needs_redis,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]
TTL = 1.5


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[Server, Server]]:
    """Primary ``a`` and ``b`` replicating it."""
    a = Server(tmp_path, "a")
    b = Server(tmp_path, "b")
    a.start()
    b.extra = ["--replicaof", "127.0.0.1", str(a.port)]
    b.start()
    try:
        yield a, b
    finally:
        b.kill()
        a.kill()


def replicate(server: Server, primary: Server | None) -> None:
    with server.client() as c:
        if primary is None:
            c.replicaof("NO", "ONE")
        else:
            c.replicaof("127.0.0.1", primary.port)


def keys(server: Server, prefix: str) -> redis.Redis:
    return redis.Redis(port=server.port, decode_responses=True)


async def test_r_ha_2_a_promoted_replica_that_missed_writes_is_a_new_epoch_within_capacity(
    servers: tuple[Server, Server],
) -> None:
    """``b`` stops replicating (a copy of the store as it was); ``a`` then grants a second
    lease and a third Edge starts with a new fence. ``a`` becomes a replica of ``b`` and is
    promoted again: the Edges' store is now ``b``'s older copy, on the same address, with a
    new replication id. Every Edge sees a new epoch; admissions wait for the grace; the lease
    the copy never saw is counted again, so a third request on capacity 2 queues; the third
    Edge keeps its fence and no later start or lease gets an id handed out before."""
    a, b = servers
    in_sync(a, b)
    url = f"redis://127.0.0.1:{a.port}/0"
    async with edges(url) as group:
        pol = policy(prov("p1", cap=2))
        one = await group.start(pol, "edge-1", ttl=TTL)
        two = await group.start(pol, "edge-2", ttl=TTL)
        one.node_ready("n1", 1)
        first = await one.acquire("m")
        await one.flush()
        epoch = one._epoch
        in_sync(a, b)
        replicate(b, None)  # b's copy: one lease, two Edges

        second = await one.acquire("m")  # writes the copy never sees
        three = await group.start(pol, "edge-3", ttl=TTL)
        assert three.fence is not None
        with keys(a, group.prefix) as c:
            handed = int(c.get(f"{group.prefix}:fence_seq") or 0)
        assert handed >= int(three.fence)

        replicate(a, b)  # a takes b's older copy ...
        in_sync(b, a)
        replicate(a, None)  # ... and is promoted with it: another replication id

        await until(lambda: epoch not in (one._epoch, two._epoch, three._epoch), "a new epoch")
        with pytest.raises((PoolRecovering, PoolBackendUnavailable)):
            await two.acquire("m")  # within the grace: nothing is admitted yet

        # After the grace: both of edge-1's leases count (the second was re-asserted).
        async def admitted_or_queued() -> asyncio.Task[object]:
            while True:
                task = asyncio.create_task(two.acquire("m"))
                await asyncio.sleep(0)  # its admission is submitted ...
                await two.flush()  # ... and answered: done unless queued
                await asyncio.sleep(0)
                if not task.done():
                    return task
                exc = task.exception()
                assert isinstance(exc, (PoolRecovering, PoolBackendUnavailable)), (
                    f"admitted {task.result()} while {first} and {second} hold capacity 2"
                )
                await asyncio.sleep(0.05)

        waiting = await asyncio.wait_for(admitted_or_queued(), 20)
        await queued(two, 1)
        snap = await two.fetch_snapshot()
        assert (snap.providers[0].in_flight, snap.queue_depth) == (2, 1)

        one.release(first)
        lease = await asyncio.wait_for(waiting, 10)
        assert lease.request_id > second.request_id  # no lease id handed out twice
        two.release(lease)
        one.release(second)

        assert not three.fenced  # its fence, lost with the writes, is claimed again
        four = await group.start(pol, "edge-4", ttl=TTL)
        assert four.fence is not None and int(four.fence) > handed  # never handed out twice
        with keys(a, group.prefix) as c:
            assert c.hget(f"{group.prefix}:fences", "edge-3") == three.fence
        await one.flush()
        snap = await one.fetch_snapshot()
        assert (snap.providers[0].in_flight, snap.queue_depth) == (0, 0)


async def test_r_ha_2_the_same_server_reconnected_is_no_loss(
    servers: tuple[Server, Server],
) -> None:
    """A connection broken and made again to the same server (its identity unchanged) keeps
    the epoch: no grace, no re-assertion."""
    a, _ = servers
    async with edges(f"redis://127.0.0.1:{a.port}/0") as group:
        pol = policy(prov("p1", cap=1))
        one = await group.start(pol, "edge-1", ttl=TTL)
        one.node_ready("n1", 1)
        epoch = one._epoch
        with a.client() as c:
            c.client_kill_filter(_type="normal", skipme=True)
        with pytest.raises(PoolBackendUnavailable):
            for _ in range(100):
                one.release(await one.acquire("m"))
                await asyncio.sleep(0.01)
        await until(lambda: one.reachable, "the store answering again")
        lease = await one.acquire("m")  # no grace: the epoch is the same
        assert one._epoch == epoch
        one.release(lease)
