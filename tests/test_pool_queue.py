"""The root queue: bound, deadline, order, and waiters stranded by nodes (R-POOL-4/5/6, R-NODE)."""

from __future__ import annotations

import asyncio

import pytest

from pool.engine import (
    Lease,
    PoolPolicy,
    PoolProvider,
    ProviderPool,
    QueueFull,
    QueueTimeout,
    Unavailable,
)
from tests.support.clock import Clock
from tests.support.pools import prov, ready_pool


async def wait_queued(pool: ProviderPool, depth: int) -> None:
    """Let freshly created acquire tasks reach the queue (bounded number of loop turns)."""
    for _ in range(100):
        if pool.snapshot().queue_depth == depth:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"queue depth never reached {depth}")


async def queue_up(
    pool: ProviderPool, *models: str, long: bool = False
) -> list[asyncio.Task[Lease]]:
    depth = pool.snapshot().queue_depth
    tasks = []
    for model in models:  # one at a time so enqueue order is the list order
        tasks.append(asyncio.create_task(pool.acquire(model, long=long)))
        depth += 1
        await wait_queued(pool, depth)
    return tasks


async def test_queue_full_rejects_at_once_across_model_groups_r_pool_4() -> None:
    pool = ready_pool(prov("a"), prov("b"), groups={"ma": ("a",), "mb": ("b",)}, max_queue=2)
    await pool.acquire("ma")
    await pool.acquire("mb")
    waiters = await queue_up(pool, "ma", "mb")  # the bound counts both groups together
    with pytest.raises(QueueFull) as err:
        await pool.acquire("ma")
    assert err.value.code == "queue_full"
    assert pool.snapshot().queue_depth == 2
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)


async def test_waiter_times_out_by_itself_after_queue_timeout_r_pool_4() -> None:
    pool = ProviderPool(PoolPolicy((prov("a"),), {"m": ("a",)}, 4, queue_timeout_ms=30))
    pool.node_ready("n1", 1)
    await pool.acquire("m")
    with pytest.raises(QueueTimeout) as err:
        await asyncio.wait_for(pool.acquire("m"), 5)  # the pool's own timer ends it
    assert err.value.code == "queue_timeout"
    assert pool.snapshot().queue_depth == 0


async def test_waiters_time_out_in_enqueue_order_at_their_own_deadline_r_pool_4() -> None:
    clock = Clock()
    pool = ready_pool(prov("a"), timeout_ms=1000, clock=clock)
    await pool.acquire("m")
    (first,) = await queue_up(pool, "m")
    clock.now += 0.5
    (second,) = await queue_up(pool, "m")
    clock.now += 0.5  # first is due, second has 0.5 s left
    assert pool.expire() == 1
    with pytest.raises(QueueTimeout):
        await first
    assert not second.done() and pool.snapshot().queue_depth == 1
    clock.now += 0.5
    assert pool.expire() == 1
    with pytest.raises(QueueTimeout):
        await second


async def test_an_overdue_waiter_does_not_make_the_queue_look_full_r_pool_4() -> None:
    clock = Clock()
    pool = ready_pool(prov("a"), max_queue=1, timeout_ms=1000, clock=clock)
    await pool.acquire("m")
    (overdue,) = await queue_up(pool, "m")
    clock.now += 1.0  # due, and the arrival below comes before the timer's turn
    fresh = asyncio.create_task(pool.acquire("m"))
    with pytest.raises(QueueTimeout):
        await asyncio.wait_for(overdue, 2)
    await wait_queued(pool, 1)
    assert not fresh.done()  # queued in the slot the overdue waiter left, not QueueFull
    fresh.cancel()
    await asyncio.gather(fresh, return_exceptions=True)


async def test_zero_timeout_means_no_deadline_r_pool_4() -> None:
    clock = Clock()
    pool = ready_pool(prov("a"), timeout_ms=0, clock=clock)
    lease = await pool.acquire("m")
    (waiter,) = await queue_up(pool, "m")
    clock.now += 86400.0
    assert pool.expire() == 0
    pool.release(lease)
    assert (await asyncio.wait_for(waiter, 2)).provider_id == "a"


async def first_done(tasks: list[asyncio.Task[Lease]]) -> set[asyncio.Task[Lease]]:
    done, _ = await asyncio.wait(tasks, timeout=2, return_when=asyncio.FIRST_COMPLETED)
    return done


async def test_release_dispatches_the_earliest_waiter_first_r_pool_5() -> None:
    pool = ready_pool(prov("a"))
    lease = await pool.acquire("m")
    tasks = await queue_up(pool, "m", "m", "m")
    for i, task in enumerate(tasks):
        pool.release(lease)
        assert await first_done(tasks[i:]) == {task}
        lease = task.result()


async def test_waiter_that_cannot_run_does_not_block_a_later_one_r_pool_5() -> None:
    pool = ready_pool(prov("a"), prov("b"), groups={"ma": ("a",), "mb": ("b",)})
    await pool.acquire("ma")
    lease_b = await pool.acquire("mb")
    blocked, runnable = await queue_up(pool, "ma", "mb")
    pool.release(lease_b)
    assert await first_done([blocked, runnable]) == {runnable}
    assert pool.snapshot().queue_depth == 1
    blocked.cancel()
    await asyncio.gather(blocked, return_exceptions=True)


async def test_long_waiter_at_the_head_does_not_block_a_normal_one_r_pool_5() -> None:
    pool = ready_pool(prov("a", cap=2, long_cap=1))
    await pool.acquire("m", long=True)
    normal = await pool.acquire("m")
    (long_waiter,) = await queue_up(pool, "m", long=True)
    (normal_waiter,) = await queue_up(pool, "m")
    pool.release(normal)  # a normal slot only: the long waiter still cannot run
    assert await first_done([long_waiter, normal_waiter]) == {normal_waiter}
    long_waiter.cancel()
    await asyncio.gather(long_waiter, return_exceptions=True)


@pytest.mark.parametrize("how", ["node_gone", "disabled", "removed", "capability_dropped"])
async def test_waiter_ends_unavailable_at_once_when_its_candidates_vanish_r_pool_6(
    how: str,
) -> None:
    clock = Clock()
    pool = ready_pool(prov("a"), timeout_ms=60000, clock=clock)
    await pool.acquire("m")
    waiter = asyncio.create_task(pool.acquire("m", frozenset({"chat"})))
    await wait_queued(pool, 1)
    if how == "node_gone":
        pool.node_gone("n1", 1)
    else:
        changed = {
            "disabled": (PoolProvider("n1", "a", 1, 0, 10, False, frozenset({"chat"})),),
            "removed": (),
            "capability_dropped": (PoolProvider("n1", "a", 1, 0, 10, True, frozenset()),),
        }[how]
        pool.apply(PoolPolicy(changed, {"m": ("a",)}, 16, 60000))
    assert pool.snapshot().queue_depth == 0  # ended now, not at its deadline (clock frozen)
    with pytest.raises(Unavailable):
        await waiter


async def test_waiter_keeps_waiting_while_another_candidate_is_live_r_pool_6() -> None:
    pool = ready_pool(prov("a", node="n1"), prov("b", node="n2"))
    await pool.acquire("m")
    lease_b = await pool.acquire("m")
    (waiter,) = await queue_up(pool, "m")
    pool.node_gone("n1", 1)
    assert pool.snapshot().queue_depth == 1
    pool.release(lease_b)
    assert (await asyncio.wait_for(waiter, 2)).provider_id == "b"


async def test_node_becoming_ready_dispatches_a_queued_waiter_once_r_node_1_r_node_3() -> None:
    pool = ready_pool(prov("a", node="n1"), prov("b", node="n2"))
    pool.node_gone("n2", 1)  # n2 drops; "a" keeps the waiter alive
    await pool.acquire("m")
    (waiter,) = await queue_up(pool, "m")
    pool.node_ready("n2", 2)  # reconnect, ready with a new generation
    pool.node_ready("n2", 2)  # a duplicate ready must not dispatch anything twice
    lease = await asyncio.wait_for(waiter, 2)
    assert lease.provider_id == "b"
    statuses = {r.provider_id: r for r in pool.snapshot().providers}
    assert statuses["b"].online and statuses["b"].in_flight == 1
    assert pool.snapshot().queue_depth == 0


async def test_older_generation_going_away_keeps_the_ready_node_r_node_1() -> None:
    pool = ready_pool(prov("a"))
    pool.node_ready("n1", 2)
    pool.node_gone("n1", 1)  # the replaced connection closes late
    assert (await pool.acquire("m")).provider_id == "a"


async def test_ready_of_an_ended_generation_is_ignored_r_node_1() -> None:
    pool = ready_pool(prov("a"))
    pool.node_gone("n1", 1)
    pool.node_ready("n1", 1)  # a late ready of the connection that already ended
    with pytest.raises(Unavailable):
        await pool.acquire("m")
    pool.node_ready("n1", 2)
    assert (await pool.acquire("m")).provider_id == "a"
