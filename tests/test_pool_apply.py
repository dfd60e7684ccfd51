"""Live apply of a new pool policy: leases kept, waiters re-evaluated (R-REF-3, R-POOL-5)."""

from __future__ import annotations

import asyncio

import pytest

from pool.engine import PoolPolicy, PoolProvider, ProviderPool, QueueTimeout
from tests.support.clock import Clock
from tests.support.pools import enqueue, prov, ready_pool


def policy(*providers: PoolProvider, timeout_ms: int = 0) -> PoolPolicy:
    return PoolPolicy(providers, {"m": tuple(p.provider_id for p in providers)}, 16, timeout_ms)


def in_flight(pool: ProviderPool, pid: str) -> int:
    return next(r.in_flight for r in pool.snapshot().providers if r.provider_id == pid)


async def test_apply_keeps_existing_leases_r_ref_3() -> None:
    pool = ready_pool(prov("a", cap=2))
    leases = [await pool.acquire("m"), await pool.acquire("m")]
    pool.apply(policy(prov("a", cap=2, prio=1)))
    assert in_flight(pool, "a") == 2
    assert [pool.release(lease) for lease in leases] == [True, True]
    assert pool.idle()


async def test_lowered_capacity_admits_nothing_until_in_flight_is_below_it_r_ref_3() -> None:
    pool = ready_pool(prov("a", cap=3))
    leases = [await pool.acquire("m") for _ in range(3)]
    pool.apply(policy(prov("a", cap=1)))
    waiter = await enqueue(pool)  # 3 running, capacity 1: queue
    pool.release(leases.pop())
    pool.release(leases.pop())  # 1 running: still not below 1
    assert pool.snapshot().queue_depth == 1 and in_flight(pool, "a") == 1
    pool.release(leases.pop())
    assert (await asyncio.wait_for(waiter, 2)).provider_id == "a"
    assert in_flight(pool, "a") == 1


async def test_raised_capacity_dispatches_waiters_in_enqueue_order_r_ref_3() -> None:
    pool = ready_pool(prov("a", cap=1))
    await pool.acquire("m")
    first, second, third = [await enqueue(pool) for _ in range(3)]
    pool.apply(policy(prov("a", cap=3)))  # two more slots: the two oldest waiters get them
    granted = await asyncio.wait_for(asyncio.gather(first, second), 2)
    assert [lease.provider_id for lease in granted] == ["a", "a"]
    assert not third.done() and pool.snapshot().queue_depth == 1
    third.cancel()
    await asyncio.gather(third, return_exceptions=True)


async def test_new_provider_takes_a_waiter_at_apply_r_ref_3() -> None:
    pool = ready_pool(prov("a"))
    await pool.acquire("m")
    waiter = await enqueue(pool)
    pool.apply(policy(prov("a"), prov("b")))
    assert (await asyncio.wait_for(waiter, 2)).provider_id == "b"


async def test_apply_recomputes_deadlines_from_enqueue_time_r_ref_3() -> None:
    clock = Clock()
    pool = ready_pool(prov("a"), timeout_ms=10_000, clock=clock)
    await pool.acquire("m")
    old = await enqueue(pool)
    clock.now += 2.0
    young = await enqueue(pool)
    clock.now += 1.0  # old waited 3 s, young 1 s
    pool.apply(policy(prov("a"), timeout_ms=3_000))  # old is due now, young in 2 s
    assert pool.snapshot().queue_depth == 1  # at apply itself, not at a later timer turn
    with pytest.raises(QueueTimeout):
        await asyncio.wait_for(old, 2)
    assert not young.done() and pool.snapshot().queue_depth == 1
    clock.now += 1.9
    assert pool.expire() == 0
    clock.now += 0.1
    assert pool.expire() == 1
    with pytest.raises(QueueTimeout):
        await young


async def test_apply_with_zero_timeout_removes_deadlines_r_ref_3() -> None:
    clock = Clock()
    pool = ready_pool(prov("a"), timeout_ms=1_000, clock=clock)
    lease = await pool.acquire("m")
    waiter = await enqueue(pool)
    pool.apply(policy(prov("a"), timeout_ms=0))
    clock.now += 3600.0
    assert pool.expire() == 0
    pool.release(lease)
    assert (await asyncio.wait_for(waiter, 2)).provider_id == "a"


async def test_priority_change_steers_the_next_selection_r_ref_3() -> None:
    pool = ready_pool(prov("a", cap=4, prio=10), prov("b", cap=4, prio=20))
    lease = await pool.acquire("m")
    assert lease.provider_id == "a"
    pool.release(lease)
    pool.apply(policy(prov("a", cap=4, prio=30), prov("b", cap=4, prio=20)))
    assert (await pool.acquire("m")).provider_id == "b"
