"""Provider health in the pool's ledger, on a hand-driven clock: ejection, backoff, the
half-open trial, probes, exclusion sets and the runtime's timer (R-HEALTH-1..3)."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from iop_site.health import HealthWatch
from pool.engine import (
    HealthPolicy,
    Lease,
    PoolPolicy,
    PoolProvider,
    ProviderPool,
    Unavailable,
)
from tests.support.clock import Clock


def policy(
    health: HealthPolicy | None = None, fingerprint: str = "openai|http://a", capacity: int = 2
) -> PoolPolicy:
    return PoolPolicy(
        providers=(
            PoolProvider("n1", "p1", capacity, 0, 10, True, frozenset(), fingerprint),
            PoolProvider("n1", "p2", capacity, 0, 20, True, frozenset(), "openai|http://b"),
        ),
        groups={"m": ("p1", "p2"), "solo": ("p1",)},
        max_queue=8,
        queue_timeout_ms=0,
        health=health or HealthPolicy(eject_after_failures=2, eject_base_s=10, eject_max_s=35),
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def pool(clock: Clock) -> ProviderPool:
    pool = ProviderPool(policy(), clock=clock)
    pool.node_ready("n1", 1)
    return pool


def row(pool: ProviderPool, pid: str):  # type: ignore[no-untyped-def]
    return next(p for p in pool.snapshot().providers if p.provider_id == pid)


async def lease_on(pool: ProviderPool, model: str = "solo") -> Lease:
    return await pool.acquire(model)


async def fail(pool: ProviderPool, times: int, model: str = "solo") -> None:
    for _ in range(times):
        lease = await lease_on(pool, model)
        pool.failed(lease, "cannot connect to the upstream")
        pool.release(lease)


async def trial_after_ejection(pool: ProviderPool, clock: Clock) -> Lease:
    """Eject p1, let its 10 s pass and the timer wake it: the next ``solo`` lease is its trial."""
    await fail(pool, 2)
    clock.now += 10
    pool.wake()
    return await lease_on(pool)


async def test_failures_in_a_row_eject_for_the_base_then_doubling_up_to_the_cap_r_health_2(
    pool: ProviderPool, clock: Clock
) -> None:
    """R-HEALTH-2: 10 s, then 20 s, then capped at 35 s; each trial that fails re-ejects."""
    await fail(pool, 1)
    assert row(pool, "p1").health == "healthy" and row(pool, "p1").consecutive_failures == 1
    await fail(pool, 1)
    assert (row(pool, "p1").health, row(pool, "p1").ejected_for_s) == ("ejected", 10.0)
    for expected in (20.0, 35.0, 35.0):
        clock.now = pool.next_wake()  # type: ignore[assignment]
        assert pool.wake() == 1 and row(pool, "p1").health == "probing"
        await fail(pool, 1)  # the trial fails
        assert (row(pool, "p1").health, row(pool, "p1").ejected_for_s) == ("ejected", expected)
    assert pool.ejections_total == {"p1": 4}
    assert pool.idle()


async def test_a_success_in_between_starts_the_count_again_r_health_2(pool: ProviderPool) -> None:
    await fail(pool, 1)
    lease = await lease_on(pool)
    pool.succeeded(lease)
    pool.release(lease)
    await fail(pool, 1)
    assert row(pool, "p1").health == "healthy"


async def test_an_ejected_provider_is_skipped_and_a_group_of_only_it_is_unavailable_at_once(
    pool: ProviderPool,
) -> None:
    """R-HEALTH-2: selection skips the row; ``solo`` has nothing left and says why."""
    await fail(pool, 2)
    lease = await lease_on(pool, "m")
    assert lease.provider_id == "p2"
    pool.release(lease)
    with pytest.raises(Unavailable) as refused:
        await lease_on(pool)
    assert "ejected" in str(refused.value) and "cannot connect to the upstream" in str(
        refused.value
    )
    assert pool.snapshot().queue_depth == 0


async def test_waiters_left_with_only_ejected_providers_fail_at_once(
    clock: Clock,
) -> None:
    """R-HEALTH-2: the queue does not hold requests that cannot run."""
    pool = ProviderPool(policy(capacity=1), clock=clock)
    pool.node_ready("n1", 1)
    busy = await lease_on(pool)
    waiter = asyncio.ensure_future(lease_on(pool))
    await asyncio.sleep(0)
    assert pool.snapshot().queue_depth == 1
    pool.failed(busy, "upstream answered HTTP 502", retry_after_s=None)
    pool.failed(busy, "upstream answered HTTP 502", retry_after_s=None)  # second in a row
    with pytest.raises(Unavailable):
        await waiter
    pool.release(busy)
    assert pool.idle()


async def test_half_open_lets_exactly_one_trial_through_and_its_success_restores_r_health_2(
    pool: ProviderPool, clock: Clock
) -> None:
    trial = await trial_after_ejection(pool, clock)
    assert trial.provider_id == "p1"
    other = await lease_on(pool, "m")  # p1 has a free slot, but only one trial is let through
    assert other.provider_id == "p2"
    pool.succeeded(trial)
    pool.release(trial)
    assert row(pool, "p1").health == "healthy" and row(pool, "p1").health_reason == ""
    both = [await lease_on(pool), await lease_on(pool)]  # full capacity again
    assert {lease.provider_id for lease in both} == {"p1"}
    for lease in (other, *both):
        pool.release(lease)
    await fail(pool, 2)  # the backoff started over
    assert row(pool, "p1").ejected_for_s == 10.0


async def test_a_trial_that_ends_without_a_verdict_lets_the_next_request_try(
    pool: ProviderPool, clock: Clock
) -> None:
    """A trial whose caller went away says nothing: the next request is the trial."""
    trial = await trial_after_ejection(pool, clock)
    pool.release(trial)  # no succeeded/failed: cancelled
    again = await lease_on(pool)
    assert again.provider_id == "p1" and row(pool, "p1").health == "probing"
    pool.succeeded(again)
    pool.release(again)
    assert row(pool, "p1").health == "healthy"


async def test_retry_after_ejects_for_that_long_capped_by_eject_max(
    pool: ProviderPool, clock: Clock
) -> None:
    lease = await lease_on(pool)
    pool.failed(lease, "rate limited by the upstream (HTTP 429)", retry_after_s=5.0)
    pool.release(lease)
    assert row(pool, "p1").ejected_for_s == 5.0
    clock.now += 5
    pool.wake()
    lease = await lease_on(pool)
    pool.failed(lease, "rate limited by the upstream (HTTP 429)", retry_after_s=3600.0)
    pool.release(lease)
    assert row(pool, "p1").ejected_for_s == 35.0


async def test_eject_after_failures_zero_never_ejects(clock: Clock) -> None:
    pool = ProviderPool(policy(HealthPolicy(eject_after_failures=0)), clock=clock)
    pool.node_ready("n1", 1)
    await fail(pool, 10)
    lease = await lease_on(pool)
    pool.failed(lease, "rate limited", retry_after_s=30.0)
    pool.release(lease)
    assert row(pool, "p1").health == "healthy"


async def test_an_active_probe_restores_only_once_the_ejection_is_over_r_health_3(
    pool: ProviderPool, clock: Clock
) -> None:
    """R-HEALTH-3: a probe counts as the trial; a failing probe ejects like a request."""
    pool.probed("n1", "p1", False, "HTTP 503")
    pool.probed("n1", "p1", False, "HTTP 503")
    assert row(pool, "p1").health == "ejected"
    assert row(pool, "p1").health_reason.startswith("probe failed: HTTP 503")
    pool.probed("n1", "p1", True)
    assert row(pool, "p1").health == "ejected"  # too early
    clock.now += 10
    pool.probed("n1", "p1", True)  # before the timer fired: the probe is the trial
    assert row(pool, "p1").health == "healthy"
    pool.probed("n9", "p1", False, "x")  # another node cannot speak for p1
    pool.probed("n9", "p1", False, "x")
    assert row(pool, "p1").health == "healthy"


async def test_a_new_address_resets_health_and_other_applies_keep_it(
    pool: ProviderPool,
) -> None:
    """Refresh: an apply that changes a provider's address or profile resets its health."""
    await fail(pool, 2)
    pool.apply(policy(capacity=3))
    assert row(pool, "p1").health == "ejected"
    pool.apply(policy(capacity=3, fingerprint="openai|http://new"))
    assert row(pool, "p1").health == "healthy" and pool.next_wake() is None
    assert (await lease_on(pool)).provider_id == "p1"


async def test_an_exclusion_set_leaves_the_failed_provider_out_r_health_1(
    pool: ProviderPool,
) -> None:
    """R-HEALTH-1: a retry never goes back to a provider that failed the request."""
    lease = await pool.acquire("m", exclude=frozenset({"p1"}))
    assert lease.provider_id == "p2"
    with pytest.raises(Unavailable):
        await pool.acquire("solo", exclude=frozenset({"p1"}))
    pool.release(lease)
    assert pool.idle()


async def test_the_runtime_timer_brings_an_ejected_provider_back_and_pumps_the_queue(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """R-HEALTH-2, R-HEALTH-4: the timer (not the engine) ends the ejection; a queued waiter
    then runs as the trial; every change is one log line."""
    caplog.set_level(logging.INFO, logger="iop.pool.health")
    pool = ProviderPool(
        policy(HealthPolicy(eject_after_failures=1, eject_base_s=0.05, eject_max_s=0.05)),
    )
    watch = HealthWatch(pool)
    probing = asyncio.Event()

    def changed() -> None:
        watch.rearm()
        if row(pool, "p1").health == "probing":
            probing.set()

    pool.on_health_change = changed
    pool.node_ready("n1", 1)
    await fail(pool, 1)
    assert row(pool, "p1").health == "ejected"
    async with asyncio.timeout(5):
        await probing.wait()  # only the runtime's timer can bring this about
    trial = await lease_on(pool)
    pool.succeeded(trial)
    pool.release(trial)
    watch.close()
    changes = [r.getMessage() for r in caplog.records if r.name == "iop.pool.health"]
    assert [re.search(r"(\w+) -> (\w+)", m).groups() for m in changes] == [  # type: ignore[union-attr]
        ("healthy", "ejected"),
        ("ejected", "probing"),
        ("probing", "healthy"),
    ]
