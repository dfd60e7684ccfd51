"""The Edge's event-loop lag on /metrics rises when the loop is held, and the sampler stops
with the runtime (docs/metering.md)."""

from __future__ import annotations

import asyncio
import gc
import time

from prometheus_client.parser import text_string_to_metric_families

from catalog.config import load_snapshot
from iop_site.runtime import EdgeRuntime
from nodes.heap import settle_heap
from pool.http.metrics import render_metrics

INTERVAL_S = 0.2
BLOCK_S = 0.6  # held for longer than one interval, so a tick falls due inside the hold
SNAPSHOT = {
    "edge": {"id": "e", "listen": "127.0.0.1:17000"},
    "admin": {"listen": "127.0.0.1:17001"},
    "openai": {"listen": "127.0.0.1:17002"},
}


def scrape(runtime: EdgeRuntime) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample of the exposition, by sample name and labels."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(render_metrics(runtime).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


async def tick_after(runtime: EdgeRuntime, seen: int) -> None:
    """Wait (bounded) for the sampler's next tick: a timer event, so poll the loop's clock,
    not a count of loop turns, which a fast machine exhausts before the timer is due."""
    for _ in range(1000):  # at most 1000 * INTERVAL_S / 10 = 20 s
        if runtime.loop_lag.samples > seen:
            return
        await asyncio.sleep(INTERVAL_S / 10)
    raise AssertionError("the loop-lag sampler did not tick")


def bucket(metrics: dict, le: str) -> float:
    return metrics["iop_event_loop_lag_sample_seconds_bucket"][(("le", le),)]


async def test_the_loop_lag_gauge_rises_past_the_time_the_loop_was_held() -> None:
    runtime = EdgeRuntime(load_snapshot(SNAPSHOT), loop_lag_interval_s=INTERVAL_S)
    runtime.start()
    try:
        await tick_after(runtime, 0)
        before = scrape(runtime)
        seen = runtime.loop_lag.samples

        time.sleep(BLOCK_S)  # hold the loop on purpose  # noqa: ASYNC251
        await tick_after(runtime, seen)
        after = scrape(runtime)
    finally:
        await runtime.aclose()

    # The tick that fell due during the hold ran at least BLOCK_S - INTERVAL_S late.
    lower_bound = BLOCK_S - INTERVAL_S
    lag = after["iop_event_loop_lag_seconds"][()]
    assert lag >= lower_bound
    assert lag > before["iop_event_loop_lag_seconds"][()]
    late_before = before["iop_event_loop_lag_sample_seconds_count"][()] - bucket(before, "0.25")
    late_after = after["iop_event_loop_lag_sample_seconds_count"][()] - bucket(after, "0.25")
    assert late_after - late_before >= 1
    assert after["iop_event_loop_lag_sample_seconds_sum"][()] >= lower_bound


async def test_a_second_start_keeps_the_one_lag_timer_and_closing_the_runtime_stops_it() -> None:
    runtime = EdgeRuntime(load_snapshot(SNAPSHOT), loop_lag_interval_s=INTERVAL_S)
    assert not runtime.loop_lag.running
    runtime.start()
    timer = runtime.loop_lag._handle
    runtime.start()
    assert runtime.loop_lag._handle is timer
    await runtime.aclose()
    assert not runtime.loop_lag.running
    assert timer is not None and timer.cancelled()


def test_settling_the_heap_freezes_what_is_alive_at_startup() -> None:
    gc.unfreeze()
    try:
        frozen = settle_heap()
        assert frozen > 0
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
