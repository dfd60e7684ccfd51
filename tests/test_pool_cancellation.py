"""Every lease released exactly once, whatever ends the run; idle means all zero (R-POOL-9)."""

from __future__ import annotations

import asyncio

import pytest

from pool.engine import (
    PoolPolicy,
    ProviderPool,
    QueueFull,
    QueueTimeout,
    Unavailable,
)
from tests.support.clock import Clock
from tests.support.pools import enqueue, prov, ready_pool

A = prov("a", long_cap=1)
POLICY = PoolPolicy((A,), {"m": ("a",)}, max_queue=4, queue_timeout_ms=0)


def assert_zeroed(pool: ProviderPool) -> None:
    snap = pool.snapshot()
    assert pool.idle()
    assert (snap.queue_depth, snap.oldest_wait_ms) == (0, 0.0)
    assert all((r.in_flight, r.long_in_flight, r.queued) == (0, 0, 0) for r in snap.providers)


async def test_cancel_while_queued_counters_return_to_zero() -> None:
    pool = ready_pool(A, max_queue=4)
    lease = await pool.acquire("m")
    waiter = await enqueue(pool)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert pool.snapshot().queue_depth == 0  # left the queue with its caller
    assert pool.release(lease)
    assert_zeroed(pool)


async def test_cancel_just_before_a_release_is_never_dispatched_counters_return_to_zero() -> None:
    pool = ready_pool(A, max_queue=4)
    lease = await pool.acquire("m")
    gone, behind = await enqueue(pool), await enqueue(pool)
    gone.cancel()  # same loop tick: the cancelled task has not run its cleanup yet
    pool.release(lease)
    next_lease = await asyncio.wait_for(behind, 2)  # the slot skips the cancelled waiter
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert pool.snapshot().providers[0].in_flight == 1
    pool.release(next_lease)
    assert_zeroed(pool)


async def test_cancel_in_the_tick_a_lease_is_granted_counters_return_to_zero() -> None:
    pool = ready_pool(A, max_queue=4)
    lease = await pool.acquire("m", long=True)
    waiter = await enqueue(pool, long=True)
    pool.release(lease)  # grants the waiter synchronously...
    assert pool.snapshot().providers[0].long_in_flight == 1
    waiter.cancel()  # ...whose task is cancelled before it could see the lease
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert_zeroed(pool)  # the granted lease was released for it: no leak


async def test_timeout_wrapper_cancelling_a_waiter_counters_return_to_zero() -> None:
    pool = ready_pool(A, max_queue=4)
    lease = await pool.acquire("m")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(pool.acquire("m"), 0.01)
    pool.release(lease)
    assert_zeroed(pool)


async def test_release_twice_counters_return_to_zero() -> None:
    pool = ready_pool(A, max_queue=4)
    lease = await pool.acquire("m", long=True)
    assert not lease.released
    assert pool.release(lease) is True
    assert pool.release(lease) is False
    assert lease.released
    assert_zeroed(pool)
    assert (await pool.acquire("m", long=True)).provider_id == "a"  # not double-freed


async def test_release_after_node_gone_counters_return_to_zero() -> None:
    pool = ready_pool(A, max_queue=4)
    lease = await pool.acquire("m")
    pool.node_gone("n1", 1)
    assert not pool.idle()  # still counted until its run releases it
    assert pool.release(lease) is True
    assert_zeroed(pool)
    pool.node_ready("n1", 2)
    assert pool.snapshot().providers[0].in_flight == 0
    assert_zeroed(pool)


async def test_release_after_apply_removed_the_provider_counters_return_to_zero() -> None:
    pool = ready_pool(A, max_queue=4)
    lease = await pool.acquire("m")
    pool.apply(PoolPolicy((), {"m": ()}, 4, 0))
    assert pool.snapshot().providers == () and not pool.idle()
    assert pool.release(lease) is True
    assert pool.release(lease) is False
    assert_zeroed(pool)
    pool.apply(POLICY)
    assert_zeroed(pool)


async def test_provider_readded_while_its_lease_runs_keeps_counting_counters_return_to_zero() -> (
    None
):
    pool = ready_pool(A, max_queue=4)
    lease = await pool.acquire("m")
    pool.apply(PoolPolicy((), {"m": ()}, 4, 0))
    pool.apply(POLICY)
    assert pool.snapshot().providers[0].in_flight == 1  # the running lease is still there
    waiter = await enqueue(pool)  # so capacity 1 is full
    pool.release(lease)
    pool.release(await asyncio.wait_for(waiter, 2))
    assert_zeroed(pool)


async def test_queue_timeout_counters_return_to_zero() -> None:
    clock = Clock()
    pool = ready_pool(A, max_queue=4, timeout_ms=500, clock=clock)
    lease = await pool.acquire("m")
    waiter = await enqueue(pool)
    clock.now += 0.5
    pool.expire()
    with pytest.raises(QueueTimeout):
        await waiter
    pool.release(lease)
    assert_zeroed(pool)


async def test_unavailable_while_waiting_counters_return_to_zero() -> None:
    pool = ready_pool(A, max_queue=4)
    lease = await pool.acquire("m")
    waiter = await enqueue(pool)
    pool.node_gone("n1", 1)
    with pytest.raises(Unavailable):
        await waiter
    pool.release(lease)
    assert_zeroed(pool)


async def test_queue_full_counters_return_to_zero() -> None:
    pool = ready_pool(A, max_queue=1)
    lease = await pool.acquire("m")
    waiter = await enqueue(pool)
    with pytest.raises(QueueFull):
        await pool.acquire("m")
    pool.release(lease)
    pool.release(await asyncio.wait_for(waiter, 2))
    assert_zeroed(pool)


async def test_many_cancelled_waiters_under_churn_counters_return_to_zero() -> None:
    pool = ready_pool(A, max_queue=64)
    lease = await pool.acquire("m")
    waiters = [await enqueue(pool, long=i % 3 == 0) for i in range(40)]
    for task in waiters[::2]:
        task.cancel()
    for _ in range(20):  # each release hands the slot to the oldest live waiter
        pool.release(lease)
        remaining = [t for t in waiters[1::2] if not t.done()]
        done, _ = await asyncio.wait(remaining, timeout=2, return_when="FIRST_COMPLETED")
        assert done == {remaining[0]}
        lease = remaining[0].result()
    pool.release(lease)
    await asyncio.gather(*waiters, return_exceptions=True)
    assert_zeroed(pool)
