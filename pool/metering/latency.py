"""Latency as LLM operators read it (R-OBS-3): histograms per model group and provider, and a
short in-memory window of time to first token per provider for the status page.

Buckets run from milliseconds to minutes: a queue can hold a request for minutes, a first
token takes from tens of milliseconds (a warm small model) to a minute (a long prompt).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

from pool.metering.labels import NO_LABEL, RequestLabels, RequestRecord

QUEUE_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                      30.0, 60.0, 120.0, 300.0)  # fmt: skip
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0,
                300.0)  # fmt: skip
TOKENS_PER_SECOND_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 150.0, 200.0,
                             300.0, 500.0, 1000.0, 2000.0)  # fmt: skip
WINDOW_S = 300.0  # the status page's p50 / p95 cover the last five minutes
WINDOW_SAMPLES = 1024  # per provider: the newest this many within the window


class LatencyMetrics:
    """The R-OBS-3 histograms in the meter's registry, and the TTFT window."""

    def __init__(
        self, registry: CollectorRegistry, clock: Callable[[], float] = time.monotonic
    ) -> None:
        labels = ["model_group", "provider"]
        self.queue_wait = Histogram(
            "iop_queue_wait_seconds", "Time a request waited for admission to a provider.",
            labels, buckets=QUEUE_WAIT_BUCKETS, registry=registry,
        )  # fmt: skip
        self.ttft = Histogram(
            "iop_time_to_first_token_seconds",
            "Streamed requests: arrival at the Edge to the first output byte sent to the client.",
            labels, buckets=TTFT_BUCKETS, registry=registry,
        )  # fmt: skip
        self.tokens_per_second = Histogram(
            "iop_output_tokens_per_second",
            "Output tokens over generation time (after the first token for streams).",
            labels, buckets=TOKENS_PER_SECOND_BUCKETS, registry=registry,
        )  # fmt: skip
        self.window = TTFTWindow(clock=clock)
        self._cache: dict[tuple[str, str], tuple[Any, Any, Any]] = {}

    def observe(self, record: RequestRecord, lab: RequestLabels, output_tokens: int) -> None:
        key = (lab.model_group, lab.provider)
        series = self._cache.get(key)
        if series is None:
            series = self._cache[key] = (
                self.queue_wait.labels(*key), self.ttft.labels(*key),
                self.tokens_per_second.labels(*key),
            )  # fmt: skip
        queue_wait, ttft, speed = series
        if record.queue_wait_s is not None:
            queue_wait.observe(max(record.queue_wait_s, 0.0))
        if lab.provider == NO_LABEL or lab.failed:
            return
        if record.ttft_s is not None:
            ttft.observe(max(record.ttft_s, 0.0))
            self.window.add(lab.provider, record.ttft_s)
        generating = record.duration_s - (
            record.ttft_s if record.ttft_s is not None else (record.queue_wait_s or 0.0)
        )
        if output_tokens > 0 and generating > 0.001:
            speed.observe(output_tokens / generating)


class TTFTWindow:
    """The newest time-to-first-token samples per provider within ``window_s`` (bounded)."""

    def __init__(
        self,
        window_s: float = WINDOW_S,
        max_samples: int = WINDOW_SAMPLES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self._max = max_samples
        self._clock = clock
        self._samples: dict[str, deque[tuple[float, float]]] = {}

    def add(self, provider: str, seconds: float) -> None:
        samples = self._samples.get(provider)
        if samples is None:
            samples = self._samples[provider] = deque(maxlen=self._max)
        samples.append((self._clock(), seconds))

    def percentiles(self) -> dict[str, dict[str, float | int]]:
        """Provider -> {p50_ms, p95_ms, count} over the window; providers without samples in
        it are left out."""
        since = self._clock() - self.window_s
        out: dict[str, dict[str, float | int]] = {}
        for provider, samples in list(self._samples.items()):
            while samples and samples[0][0] < since:
                samples.popleft()
            if not samples:
                continue
            values = sorted(value for _, value in samples)
            out[provider] = {
                "p50_ms": round(_rank(values, 0.50) * 1000, 1),
                "p95_ms": round(_rank(values, 0.95) * 1000, 1),
                "count": len(values),
            }
        return out


def _rank(values: list[float], q: float) -> float:
    """The nearest-rank percentile of sorted ``values``."""
    index = max(0, min(len(values) - 1, int(-(-q * len(values) // 1)) - 1))
    return values[index]
