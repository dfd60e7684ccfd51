"""Who may serve a request and which provider is picked (R-POOL-1/2/3/6/7, R-PROF-4)."""

from __future__ import annotations

import asyncio

import pytest

from pool.engine import (
    NotAdmitted,
    PoolProvider,
    ProviderPool,
    ProviderStatus,
    Unavailable,
    UnknownModel,
)
from tests.support.pools import prov, ready_pool


def row(pool: ProviderPool, pid: str) -> ProviderStatus:
    return next(r for r in pool.snapshot().providers if r.provider_id == pid)


async def wait_queued(pool: ProviderPool, depth: int) -> None:
    """Let freshly created acquire tasks reach the queue (bounded number of loop turns)."""
    for _ in range(100):
        if pool.snapshot().queue_depth == depth:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"queue depth never reached {depth}")


async def test_unknown_model_fails_as_model_not_found() -> None:
    pool = ready_pool(prov("a"))
    with pytest.raises(UnknownModel) as err:
        await pool.acquire("no-such-model")
    assert err.value.code == "model_not_found"


async def test_operation_no_provider_declares_is_not_admitted_even_offline_r_prof_4() -> None:
    # "a" declares chat but its node is not ready; nobody declares tool_calling.
    pool = ready_pool(prov("a", caps=("chat", "streaming")), ready=())
    with pytest.raises(NotAdmitted) as err:
        await pool.acquire("m", frozenset({"chat", "tool_calling"}))
    assert err.value.code == "unsupported_operation"
    with pytest.raises(Unavailable):  # admitted, but nothing live
        await pool.acquire("m", frozenset({"chat", "streaming"}))


@pytest.mark.parametrize(
    ("provider", "ready", "long"),
    [
        (prov("a"), (), False),  # accepted-but-pending node is not ready (R-NODE-1)
        (prov("a", enabled=False), ("n1",), False),  # disabled (R-CFG-9)
        (prov("a", cap=2, long_cap=0), ("n1",), True),  # no long slots (R-POOL-7)
    ],
    ids=["node-not-ready", "disabled", "no-long-slot"],
)
async def test_no_live_candidate_at_arrival_fails_at_once_r_pool_6(
    provider: PoolProvider, ready: tuple[str, ...], long: bool
) -> None:
    pool = ready_pool(provider, ready=ready)
    with pytest.raises(Unavailable) as err:
        await pool.acquire("m", long=long)
    assert err.value.code == "no_available_provider"
    assert pool.snapshot().queue_depth == 0 and pool.idle()


async def test_candidates_are_ready_enabled_admitted_providers_only_r_pool_1() -> None:
    pool = ready_pool(
        prov("good", cap=5, prio=50, caps=("chat", "tool_calling")),
        prov("offline", node="n2", cap=5, prio=0, caps=("chat", "tool_calling")),
        prov("disabled", cap=5, prio=0, enabled=False, caps=("chat", "tool_calling")),
        prov("no-tools", cap=5, prio=0, caps=("chat",)),
        ready=("n1",),
    )
    leases = [await pool.acquire("m", frozenset({"chat", "tool_calling"})) for _ in range(5)]
    assert {lease.provider_id for lease in leases} == {"good"}


async def test_lease_sums_in_flight_across_model_groups_r_pool_2() -> None:
    pool = ready_pool(
        prov("shared", cap=2), groups={"alias-a": ("shared",), "alias-b": ("shared",)}
    )
    first = await pool.acquire("alias-a")
    second = await pool.acquire("alias-b")
    assert (first.node_id, first.provider_id) == (second.node_id, second.provider_id)
    assert row(pool, "shared").in_flight == 2
    waiting = asyncio.create_task(pool.acquire("alias-a"))  # full for both aliases now
    await wait_queued(pool, 1)
    assert not waiting.done()
    pool.release(second)
    lease = await asyncio.wait_for(waiting, 2)
    assert lease.model == "alias-a" and row(pool, "shared").in_flight == 2


async def test_long_request_takes_a_long_slot_and_a_normal_slot_r_pool_7() -> None:
    pool = ready_pool(prov("a", cap=2, long_cap=1))
    long_lease = await pool.acquire("m", long=True)
    status = row(pool, "a")
    assert (status.in_flight, status.long_in_flight) == (1, 1)
    second_long = asyncio.create_task(pool.acquire("m", long=True))
    await wait_queued(pool, 1)  # long slot taken, normal slot still free
    normal = await pool.acquire("m")  # takes the last normal slot without waiting
    assert (row(pool, "a").in_flight, row(pool, "a").long_in_flight) == (2, 1)
    pool.release(normal)  # a normal slot frees, but the long slot is still held
    assert pool.snapshot().queue_depth == 1
    pool.release(long_lease)
    assert (await asyncio.wait_for(second_long, 2)).long


async def test_long_request_waits_for_a_normal_slot_too_r_pool_7() -> None:
    pool = ready_pool(prov("a", cap=1, long_cap=1))
    normal = await pool.acquire("m")
    long_task = asyncio.create_task(pool.acquire("m", long=True))
    await wait_queued(pool, 1)
    pool.release(normal)
    lease = await asyncio.wait_for(long_task, 2)
    assert lease.long and (row(pool, "a").in_flight, row(pool, "a").long_in_flight) == (1, 1)


async def test_selection_prefers_lowest_in_flight_over_priority_r_pool_3() -> None:
    """R-POOL-3: lowest in-flight first, before priority."""
    pool = ready_pool(prov("busy", cap=4, prio=0), prov("idle", cap=4, prio=90))
    first = await pool.acquire("m")
    second = await pool.acquire("m")
    assert (first.provider_id, second.provider_id) == ("busy", "idle")


async def test_selection_breaks_in_flight_ties_by_lowest_priority_value_r_pool_3() -> None:
    """R-POOL-3: an in-flight tie goes to the lowest priority value."""
    pool = ready_pool(prov("late", cap=4, prio=20), prov("early", cap=4, prio=10))
    for _ in range(3):
        lease = await pool.acquire("m")
        assert lease.provider_id == "early"
        pool.release(lease)


async def test_selection_rotates_among_full_ties_r_pool_3() -> None:
    """R-POOL-3: a full tie is broken round-robin, never always the first."""
    pool = ready_pool(prov("a", cap=4), prov("b", cap=4), prov("c", cap=4))
    picked = []
    for _ in range(6):
        lease = await pool.acquire("m")
        picked.append(lease.provider_id)
        pool.release(lease)  # back to a full tie every time
    assert picked[:3] == ["a", "b", "c"] and picked[3:] == picked[:3]
