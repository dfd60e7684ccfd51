"""The queue that tells its clients what it knows (R-QUEUE-1..3), in process: the estimate
from positions and measured service times, Retry-After from the drain time, and how a
request states its deadline (malformed values ignored, never a 500)."""

from __future__ import annotations

import asyncio

import pytest

from pool.engine.estimate import ServiceTimes, retry_after
from pool.http.errors import HttpError
from pool.http.queueing import deadline_s, wait_exceeded, with_retry_after
from tests.support.clock import Clock
from tests.support.pools import prov, ready_pool


async def test_the_estimate_is_zero_with_a_free_slot_and_unknown_before_any_lease_ended() -> None:
    clock = Clock()
    pool = ready_pool(prov("a", cap=1), clock=clock)
    assert pool.estimate_wait("m") == 0.0
    lease = await pool.acquire("m")
    assert pool.estimate_wait("m") is None  # saturated, nothing measured: no estimate
    assert pool.drain_s() is None
    clock.now += 2.0
    pool.release(lease)
    assert pool.estimate_wait("m") == 0.0


async def test_the_estimate_counts_the_competing_waiters_ahead_over_the_measured_rate() -> None:
    """R-QUEUE-3: capacity 2, leases of 2 s: one completion per second; with three waiters
    ahead a new arrival waits (3 + 1) / 1 = 4 s; the drain time of the queue is 3 s."""
    clock = Clock()
    pool = ready_pool(
        prov("a", cap=2), prov("b", cap=1), groups={"m": ("a",), "o": ("b",)}, clock=clock
    )
    first = [await pool.acquire("m"), await pool.acquire("m")]
    clock.now += 2.0
    for lease in first:
        pool.release(lease)
    held = [await pool.acquire("m"), await pool.acquire("m")]
    other = await pool.acquire("o")  # another group's provider: not a competitor
    waiters = [asyncio.create_task(pool.acquire("m")) for _ in range(3)]
    for _ in range(50):
        await asyncio.sleep(0)
    assert pool.snapshot().queue_depth == 3
    assert pool.estimate_wait("m") == pytest.approx(4.0)
    assert pool.estimate_wait("o") is None  # b saturated and never measured
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    for lease in [*held, other]:
        pool.release(lease)


def test_service_times_are_a_weighted_mean_and_bounded_in_providers() -> None:
    clock = Clock()
    times = ServiceTimes(clock)
    times.took("a", clock.now - 1.0)
    times.took("a", clock.now - 2.0)
    assert times.rate([("a", 1)]) == pytest.approx(1 / 1.2)
    times.took("b", 0.0)  # an unmeasured lease (started 0) changes nothing
    assert times.rate([("b", 3)]) is None


@pytest.mark.parametrize(
    ("seconds", "header"), [(None, 1), (0.2, 1), (2.1, 3), (1e9, 60), (float("inf"), 1)]
)
def test_retry_after_is_the_drain_time_in_whole_seconds_within_1_to_60(
    seconds: float | None, header: int
) -> None:
    assert retry_after(seconds) == header


@pytest.mark.parametrize(
    ("headers", "deadline"),
    [
        ({b"x-iop-max-wait-ms": b"1500"}, 1.5),
        ({b"x-stainless-read-timeout": b"600"}, 600.0),
        ({b"x-stainless-timeout": b"1.5"}, 1.5),
        ({b"x-iop-max-wait-ms": b"250", b"x-stainless-read-timeout": b"600"}, 0.25),
        ({b"x-iop-max-wait-ms": b"-5"}, None),
        ({b"x-iop-max-wait-ms": b"1e3"}, None),
        ({b"x-iop-max-wait-ms": b"0"}, None),
        ({b"x-iop-max-wait-ms": b"99999999999"}, None),
        ({b"x-iop-max-wait-ms": b"nope", b"x-stainless-read-timeout": b"5"}, None),
        ({b"x-stainless-read-timeout": b"NaN"}, None),
        ({b"x-stainless-read-timeout": b"100000"}, None),
        ({}, None),
    ],
)
def test_a_deadline_is_read_from_the_request_or_ignored_when_malformed(
    headers: dict[bytes, bytes], deadline: float | None
) -> None:
    assert deadline_s(headers) == deadline


def test_the_refusal_names_the_estimate_and_when_to_come_back() -> None:
    err = wait_exceeded(2.2, 1.0)
    assert (err.status, err.code) == (429, "queue_wait_exceeded")
    assert dict(err.headers()) == {b"retry-after": b"3", b"x-iop-queue-eta-ms": b"2200"}
    full = with_retry_after(HttpError("queue_full"), 7.5)
    assert dict(full.headers()) == {b"retry-after": b"8"}
    other = HttpError("invalid_request")
    assert with_retry_after(other, 7.5) is other
