"""The Redis engine across two Edges in one process (R-SCALE-2, R-POOL-1..9, R-HEALTH-2):
one capacity, one FIFO queue, shared health, on a real Redis."""

from __future__ import annotations

import asyncio
import random

import pytest

from pool.engine import (
    Lease,
    QueueFull,
    QueueTimeout,
    Unavailable,
    UnknownModel,
)
from pool.engine_redis import EdgeIdInUse, RedisPool
from tests.support.pools import prov
from tests.support.redis_pool import edges, needs_redis, policy, queued, until

pytestmark = needs_redis


async def test_r_scale_2_two_edges_never_exceed_one_provider_capacity() -> None:
    """R-SCALE-2, R-POOL-2: concurrent acquires from two Edges; in flight never above 3."""
    pol = policy(prov("p1", cap=3, long_cap=1), max_queue=64)
    async with edges() as group:
        a = await group.start(pol, "edge-a")
        b = await group.start(pol, "edge-b")
        a.node_ready("n1", 1)
        await a.flush()
        holding = 0
        most = 0

        async def one(pool: RedisPool, rng: random.Random) -> None:
            nonlocal holding, most
            lease = await pool.acquire("m", long=rng.random() < 0.3)
            holding += 1
            most = max(most, holding)
            snap = await pool.fetch_snapshot()
            assert snap.providers[0].in_flight <= 3
            assert snap.providers[0].long_in_flight <= 1
            for _ in range(rng.randrange(3)):
                await asyncio.sleep(0)
            holding -= 1
            assert pool.release(lease) is True
            assert pool.release(lease) is False

        rng = random.Random(7)
        await asyncio.gather(*(one(a if i % 2 else b, rng) for i in range(40)))
        assert most == 3
        for pool in (a, b):
            await pool.flush()
        snap = await b.fetch_snapshot()
        assert (snap.providers[0].in_flight, snap.queue_depth) == (0, 0)
        assert a.idle() and b.idle()


async def test_r_pool_5_a_waiter_on_one_edge_is_granted_by_a_release_on_the_other() -> None:
    async with edges() as group:
        a, b, held = await group.one_slot_held()
        waiting = asyncio.create_task(b.acquire("m"))
        await queued(a, 1)
        assert not waiting.done()
        a.release(held)
        lease = await asyncio.wait_for(waiting, 5)
        assert (lease.provider_id, lease.model) == ("p1", "m")
        assert not b.idle()
        b.release(lease)


async def test_r_pool_5_waiters_of_both_edges_are_served_in_one_global_order() -> None:
    async with edges() as group:
        pol = policy(prov("p1", cap=1))
        a = await group.start(pol, "edge-a")
        b = await group.start(pol, "edge-b")
        a.node_ready("n1", 1)
        held = await a.acquire("m")
        order: list[int] = []
        tasks = []
        for i in range(6):
            pool = a if i % 2 else b
            task = asyncio.create_task(pool.acquire("m"))
            task.add_done_callback(lambda _, i=i: order.append(i))
            tasks.append((pool, task))
            await queued(a, i + 1)
        lease: Lease = held
        owner = a
        for pool, task in tasks:
            owner.release(lease)
            lease = await asyncio.wait_for(task, 5)
            owner = pool
        owner.release(lease)
        assert order == list(range(6))


async def test_r_pool_6_no_live_candidate_is_unavailable_at_once_on_every_edge() -> None:
    async with edges() as group:
        pol = policy(prov("p1", node="n1"), prov("p2", node="n2"))
        a = await group.start(pol, "edge-a")
        b = await group.start(pol, "edge-b")
        with pytest.raises(Unavailable):
            await b.acquire("m")
        with pytest.raises(UnknownModel):
            await b.acquire("nope")
        a.node_ready("n1", 1)
        b.node_ready("n2", 1)
        first = await a.acquire("m")
        second = await a.acquire("m")
        assert {first.node_id, second.node_id} == {"n1", "n2"}
        waiting = asyncio.create_task(b.acquire("m"))
        await queued(a, 1)
        a.node_gone("n1", 1)
        b.node_gone("n2", 1)  # every candidate gone: the waiter fails now, not at a timeout
        with pytest.raises(Unavailable):
            await asyncio.wait_for(waiting, 5)
        a.release(first)
        a.release(second)


async def test_r_node_1_a_node_gone_from_an_older_connection_leaves_the_new_one_ready() -> None:
    """The Node moved from Edge A to Edge B: A's late node_gone is a no-op."""
    async with edges() as group:
        pol = policy(prov("p1"))
        a = await group.start(pol, "edge-a")
        b = await group.start(pol, "edge-b")
        a.node_ready("n1", 3)
        await a.flush()
        b.node_ready("n1", 1)
        await b.flush()
        a.node_gone("n1", 3)
        await a.flush()
        snap = await a.fetch_snapshot()
        assert snap.providers[0].online
        lease = await a.acquire("m")
        a.release(lease)


async def test_r_prin_3_queue_limits_hold_across_edges() -> None:
    """R-POOL-4, R-PRIN-3: max_queue and an owner's share count waiters of every Edge."""
    async with edges() as group:
        pol = policy(prov("p1", cap=1), max_queue=2)
        a = await group.start(pol, "edge-a")
        b = await group.start(pol, "edge-b")
        a.node_ready("n1", 1)
        held = await a.acquire("m")
        first = asyncio.create_task(a.acquire("m", owner="tok", max_queued=1))
        await queued(b, 1)
        with pytest.raises(QueueFull, match="share"):
            await b.acquire("m", owner="tok", max_queued=1)
        second = asyncio.create_task(b.acquire("m", owner="other", max_queued=1))
        await queued(b, 2)
        assert b.queued_by("tok") in (0, 1)  # the view may be up to 250 ms old
        await b.fetch_snapshot()
        assert b.queued_by("tok") == 1
        with pytest.raises(QueueFull):
            await b.acquire("m")
        first.cancel()
        second.cancel()
        await queued(b, 0)
        a.release(held)


async def test_r_pool_4_queue_timeout_is_decided_on_redis_time_not_edge_clocks() -> None:
    """Edge clocks may disagree: one Edge's clock is hours ahead, the waiter still times out
    after the queue timeout measured by Redis."""
    async with edges() as group:
        pol = policy(prov("p1", cap=1), timeout_ms=200)
        a = await group.start(pol, "edge-a")
        b = await group.start(pol, "edge-b", clock=lambda: asyncio.get_running_loop().time() + 7200)
        a.node_ready("n1", 1)
        held = await a.acquire("m")
        with pytest.raises(QueueTimeout):
            await asyncio.wait_for(b.acquire("m"), 5)
        a.release(held)


async def test_r_health_2_an_ejection_made_on_one_edge_holds_on_the_other() -> None:
    async with edges() as group:
        pol = policy(prov("p1", cap=2), prov("p2", cap=2, node="n2"))
        a = await group.start(pol, "edge-a")
        b = await group.start(pol, "edge-b")
        a.node_ready("n1", 1)
        a.node_ready("n2", 1)
        leases = [await a.acquire("m") for _ in range(2)]
        bad = next(lease for lease in leases if lease.provider_id == "p1")
        a.failed(bad, "upstream answered HTTP 429", retry_after_s=30)
        a.release(bad)
        await a.flush()
        assert a.ejections_total == {"p1": 1}
        assert a.next_wake() is not None
        snap = await b.fetch_snapshot()
        row = next(r for r in snap.providers if r.provider_id == "p1")
        assert row.health == "ejected" and 25 < row.ejected_for_s <= 30
        assert b.next_wake() is not None
        for _ in range(3):  # p2 takes everything while p1 is out
            lease = await b.acquire("m")
            assert lease.provider_id == "p2"
            b.release(lease)
        with pytest.raises(Unavailable, match="ejected"):
            await b.acquire("m", exclude=frozenset({"p2"}))
        b.probed("n1", "p1", False, "refused")  # an ejected row ignores a failed probe
        for lease in leases:
            a.release(lease)


async def test_r_health_2_a_trial_that_succeeded_and_is_released_at_once_restores_the_row() -> None:
    """R-HEALTH-2: the trial's ``succeeded`` and its release go in one call (the writer folds
    them): the row is healthy again, its failures 0, the lease back, the change announced;
    a success followed by another lease's release is not folded and counts the same."""
    async with edges() as group:
        a = await group.start(policy(prov("p1", cap=2)), "edge-a")
        announced: list[bool] = []
        a.on_health_change = lambda: announced.append(True)
        a.node_ready("n1", 1)
        first = await a.acquire("m")
        a.failed(first, "upstream answered HTTP 429", retry_after_s=0)
        a.release(first)
        await a.flush()
        a.wake()
        await a.flush()
        trial = await a.acquire("m")
        announced.clear()
        a.succeeded(trial)
        a.release(trial)  # the same tick: one ``release +`` call
        await a.flush()
        row = (await a.fetch_snapshot()).providers[0]
        assert (row.health, row.consecutive_failures, row.in_flight) == ("healthy", 0, 0)
        assert announced
        one, two = await a.acquire("m"), await a.acquire("m")
        a.failed(one, "upstream answered HTTP 500")
        a.release(one)
        a.succeeded(two)
        a.release(two)
        await a.flush()
        row = (await a.fetch_snapshot()).providers[0]
        assert (row.consecutive_failures, row.in_flight) == (0, 0)


async def test_r_scale_2_an_older_policy_version_never_overwrites_a_newer_one() -> None:
    async with edges() as group:
        newer = policy(prov("p1", cap=3), version=5)
        older = policy(prov("p1", cap=1), version=4)
        a = await group.start(newer, "edge-a")
        b = await group.start(older, "edge-b")
        await b.flush()
        snap = await a.fetch_snapshot()
        assert snap.providers[0].capacity == 3
        a.apply(policy(prov("p1", cap=2), version=6))
        await a.flush()
        assert (await b.fetch_snapshot()).providers[0].capacity == 2


async def test_r_scale_2_a_second_live_edge_with_the_same_id_is_refused_at_start() -> None:
    async with edges() as group:
        await group.start(policy(prov("p1")), "edge-a")
        with pytest.raises(EdgeIdInUse):
            await group.start(policy(prov("p1")), "edge-a")


async def test_r_scale_4_a_process_whose_id_was_taken_over_is_fenced() -> None:
    """R-SCALE-4: Edge A's alive key expires (a paused process), a new process claims the id
    with a newer fence; the old one's next renewal is refused whole: it is told once, holds
    nothing, admits nothing, and its leases stay counted in Redis only until they expire."""
    import redis.asyncio as aioredis

    from pool.engine import PoolBackendUnavailable

    async with edges() as group:
        pol = policy(prov("p1", cap=1))
        old = await group.start(pol, "edge-a")
        old.node_ready("n1", 1)
        held = await old.acquire("m")
        client = aioredis.Redis.from_url(group.url, decode_responses=True)
        alive = f"{group.prefix}:alive:edge-a"
        try:
            assert await client.get(alive) == old.fence
            await client.delete(alive)  # as if its TTL ran out while the process was paused
            new = await group.start(pol, "edge-a")
            assert new.fence is not None and int(new.fence) > int(old.fence or 0)
            assert await client.get(alive) == new.fence
            told: list[bool] = []
            old.on_fenced = lambda: told.append(True)
            old.renew()
            await old.flush()
            assert told == [True] and old.fenced and not old.reachable
            with pytest.raises(PoolBackendUnavailable):
                await old.acquire("m")
            old.release(held)  # nothing of the fenced process reaches Redis
            await old.flush()
            assert await client.get(alive) == new.fence  # its renewal did not take the key
            snap = await new.fetch_snapshot()
            assert snap.providers[0].in_flight == 1  # until the lease expires by TTL
            assert new.reachable and not new.fenced
        finally:
            await client.aclose()


async def test_r_pool_9_a_waiter_cancelled_as_it_is_granted_releases_its_lease() -> None:
    """The caller on Edge B goes away in the very tick a release on Edge A grants it."""
    async with edges() as group:
        pol = policy(prov("p1", cap=1))
        a = await group.start(pol, "edge-a")
        b = await group.start(pol, "edge-b")
        a.node_ready("n1", 1)
        for _ in range(5):
            held = await a.acquire("m")
            waiting = asyncio.create_task(b.acquire("m"))
            await queued(a, 1)
            a.release(held)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await a.flush()
            await b.flush()
            await until(b.idle, "B holds nothing")
            await b.flush()
            snap = await a.fetch_snapshot()
            assert (snap.providers[0].in_flight, snap.queue_depth) == (0, 0)


async def test_r_pool_9_a_cancelled_waiter_leaves_the_queue_at_once() -> None:
    async with edges() as group:
        pol = policy(prov("p1", cap=1))
        a = await group.start(pol, "edge-a")
        b = await group.start(pol, "edge-b")
        a.node_ready("n1", 1)
        held = await a.acquire("m")
        waiting = asyncio.create_task(b.acquire("m", owner="tok", max_queued=1))
        await queued(a, 1)
        waiting.cancel()
        await queued(a, 0)
        await a.fetch_snapshot()
        assert a.queued_by("tok") == 0
        a.release(held)


async def test_r_scale_8_a_read_of_the_shared_pool_is_never_older_than_its_bound() -> None:
    """R-SCALE-8: Edge A read in_flight 2; Edge B releases both leases. Within the bound A
    answers its view (it may be that old); past it, A reads Redis first: 0, never the old 2."""
    from pool.engine_redis.pool import VIEW_MAX_AGE_S
    from tests.support.clock import Clock

    clock = Clock()
    async with edges() as group:
        pol = policy(prov("p1", cap=2))
        a = await group.start(pol, "edge-a", clock=clock)
        b = await group.start(pol, "edge-b")
        b.node_ready("n1", 1)
        leases = [await b.acquire("m"), await b.acquire("m")]
        assert (await a.fresh_snapshot()).providers[0].in_flight == 2
        for lease in leases:
            b.release(lease)
        await b.flush()
        clock.now += VIEW_MAX_AGE_S / 2
        assert (await a.fresh_snapshot()).providers[0].in_flight == 2  # within the bound
        clock.now += VIEW_MAX_AGE_S / 2
        assert (await a.fresh_snapshot()).providers[0].in_flight == 0  # read first


async def test_the_scripts_touch_no_key_or_channel_outside_the_prefix(caplog) -> None:
    """Every script, run as a Redis ACL user allowed only ``{prefix}:*`` keys and channels
    (what a shared Redis gives each deployment): admissions, a waiter granted across Edges,
    health, renewal, sweep and the snapshot all run; a key outside is refused."""
    import secrets

    import redis.asyncio as aioredis
    from redis.exceptions import NoPermissionError

    from tests.support.redis_pool import REDIS_URL

    admin = aioredis.Redis.from_url(REDIS_URL)
    user, password = f"iop-test-{secrets.token_hex(4)}", secrets.token_hex(8)
    try:
        async with edges() as group:
            await admin.execute_command(
                "ACL", "SETUSER", user, "on", f">{password}", "resetkeys", f"~{group.prefix}:*",
                "resetchannels", f"&{group.prefix}:*", "+@all",
            )  # fmt: skip
            group.url = f"redis://{user}:{password}@{REDIS_URL.split('://', 1)[1]}"
            restricted = await group.start(policy(prov("p1", cap=1)), "edge-a")
            other = await group.start(policy(prov("p1", cap=1)), "edge-b")
            restricted.node_ready("n1", 1)
            held = await restricted.acquire("m")
            waiting = asyncio.create_task(other.acquire("m"))
            await queued(restricted, 1)
            restricted.failed(held, "upstream_error")
            restricted.release(held)
            lease = await asyncio.wait_for(waiting, 5)
            other.succeeded(lease)
            other.release(lease)
            for pool in (restricted, other):
                pool.renew()
                pool.sweep()
                await pool.flush()
            assert (await restricted.fetch_snapshot()).providers[0].in_flight == 0
            assert restricted.reachable and other.reachable
            refused = [r for r in caplog.records if "NOPERM" in r.getMessage() + str(r.exc_info)]
            assert not [r for r in caplog.records if r.name == "iop.pool.redis"] + refused
            client = aioredis.Redis.from_url(group.url)
            try:
                with pytest.raises(NoPermissionError):
                    await client.set("outside-the-prefix", "1")
            finally:
                await client.aclose()
    finally:
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()


def test_a_success_and_the_release_of_its_lease_are_folded_into_one_call() -> None:
    from pool.engine_redis import wire
    from pool.engine_redis.jobs import Job

    ok, release = Job("health", ["ok", "5", "n1", "p1"]), Job("release", ["5"])
    assert wire.fold([ok, release]) == [("release", ["+", "5", "n1", "p1"], [0, 1])]
    other = Job("release", ["6"])
    assert [c[0] for c in wire.fold([ok, other, release])] == ["health", "release", "release"]
    folded = wire.fold([Job("admit", ["m"]), ok, release])
    answers = wire.unfold(
        folded,
        [
            '{"e": "1", "info": [], "ev": [], "r": 0}',
            '{"e": "1", "info": [["healthy", "p1", "probing", 0, "x"]], "ev": [], "r": 1}',
        ],
        3,
    )
    assert answers[1].endswith('"r": 1}') and '"info": []' in answers[2]


async def test_r_queue_3_the_estimate_counts_the_shared_queue_over_this_edges_lease_times() -> None:
    """R-QUEUE-3 on the Redis engine: the waiters ahead from the shared view, the rate from
    this Edge's measured lease durations (one of 2 s: capacity 1 drains one per 2 s)."""
    from tests.support.clock import Clock

    clock = Clock()
    async with edges() as group:
        a = await group.start(policy(prov("p1", cap=1)), "edge-a", clock=clock)
        a.node_ready("n1", 1)
        await a.flush()
        assert (await a.fetch_snapshot()) and a.estimate_wait("m") == 0.0
        lease = await a.acquire("m")
        clock.now += 2.0
        a.release(lease)
        held = await a.acquire("m")
        waiting = asyncio.create_task(a.acquire("m"))
        await queued(a, 1)
        await a.fetch_snapshot()
        assert a.estimate_wait("m") == pytest.approx(4.0)  # (1 ahead + itself) * 2 s
        assert a.drain_s() == pytest.approx(2.0)
        assert a.estimate_wait("unknown") is None
        a.release(held)
        a.release(await asyncio.wait_for(waiting, 5))


async def test_r_aff_2_a_key_follows_its_provider_across_edges_with_its_ttl() -> None:
    """R-AFF-2: the key's provider, remembered by one Edge, wins on the other; the entry is a
    Redis key expiring after the TTL; a waiter's grant is remembered too."""
    import redis as redis_sync

    from tests.support.redis_pool import REDIS_URL

    pol = policy(prov("p1", cap=2), prov("p2", cap=2), groups={"m": ("p1", "p2")})
    async with edges() as group:
        a = await group.start(pol, "edge-a")
        b = await group.start(pol, "edge-b")
        a.node_ready("n1", 1)
        await a.flush()
        first = await a.acquire("m", affinity=("conv-x", 30.0))
        again = await b.acquire("m", affinity=("conv-x", 30.0))  # R-POOL-3 alone: the other
        assert again.provider_id == first.provider_id
        assert b.affinity_counts[0] == {"m": 1}
        client = redis_sync.Redis.from_url(REDIS_URL)
        try:
            key = f"{group.prefix}:aff:conv-x"
            assert client.get(key) == first.provider_id.encode()
            assert 0 < client.pttl(key) <= 30_000
        finally:
            client.close()
        a.release(first)
        b.release(again)
