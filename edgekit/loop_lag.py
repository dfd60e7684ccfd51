"""How late the Edge's event loop runs its callbacks, for ``/metrics`` (docs/metering.md).

A timer re-armed every ``interval_s`` notes, each time it fires, how long after its due
time it ran. Anything that holds the loop (a collector pause, blocking I/O, a long
computation, a starved CPU) shows up as lag. The cost is one timer callback per interval
and a few additions; no task, no lock.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

INTERVAL_S = 0.1
BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LoopLagSampler(Collector):
    """Samples the running loop's lag; a Prometheus collector of the latest sample (gauge)
    and of every sample so far (histogram)."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.last_s = 0.0
        self.samples = 0
        self._sum_s = 0.0
        self._counts = [0] * (len(BUCKETS_S) + 1)  # the last one: above the largest bucket
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    @property
    def running(self) -> bool:
        return self._handle is not None

    def start(self) -> None:
        """Arm the timer on the running loop; idempotent."""
        if self._handle is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._arm(self._loop.time())

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self, now: float) -> None:
        assert self._loop is not None
        self._due = now + self.interval_s
        self._handle = self._loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        lag = max(0.0, now - self._due)
        self.last_s = lag
        self.samples += 1
        self._sum_s += lag
        self._counts[bisect_left(BUCKETS_S, lag)] += 1
        self._arm(now)

    def describe(self) -> list[Metric]:
        return []  # computed at scrape time only

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "iop_event_loop_lag_seconds",
            "How late the event loop ran its latest lag timer.",
            value=self.last_s,
        )
        cumulative, buckets = 0, []
        for bound, count in zip(BUCKETS_S, self._counts, strict=False):
            cumulative += count
            buckets.append((repr(bound), float(cumulative)))
        buckets.append(("+Inf", float(self.samples)))
        yield HistogramMetricFamily(
            "iop_event_loop_lag_sample_seconds",
            f"Every lag sample (one per {self.interval_s:g} s).",
            buckets=buckets,
            sum_value=self._sum_s,
        )
