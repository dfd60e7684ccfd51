"""How long a request will wait in the queue (R-QUEUE-3), and how fast the queue drains
(R-QUEUE-1's ``Retry-After``).

Each provider's service time is measured on the leases this Edge releases (an exponentially
weighted mean of lease durations); its completion rate while saturated is then ``capacity /
service time``. A request that finds no free slot waits for the waiters ahead of it that
compete for the same providers, plus itself: ``(ahead + 1) / sum(rates of its candidates)``.
Before a provider has a measured lease its rate is unknown, and so is the estimate (None):
nothing is refused on an estimate that does not exist.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

WEIGHT = 0.2  # of the newest lease duration in the mean
MAX_PROVIDERS = 4096  # measured providers kept (ids come from the config, never a client)
RETRY_AFTER_MIN_S, RETRY_AFTER_MAX_S = 1, 60


class ServiceTimes:
    """Lease durations per provider id, and the estimates made from them."""

    __slots__ = ("_clock", "_mean")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._mean: dict[str, float] = {}

    def now(self) -> float:
        return self._clock()

    def took(self, provider_id: str, started: float) -> None:
        """A lease of ``provider_id`` taken at ``started`` (this clock) was released now."""
        if started <= 0:
            return
        seconds = max(self._clock() - started, 1e-4)
        mean = self._mean.get(provider_id)
        if mean is None:
            if len(self._mean) >= MAX_PROVIDERS:
                return
            self._mean[provider_id] = seconds
        else:
            self._mean[provider_id] = mean + WEIGHT * (seconds - mean)

    def rate(self, providers: Iterable[tuple[str, int]]) -> float | None:
        """Completions per second of ``(provider id, capacity)`` rows while saturated; None
        when none of them has a measured lease."""
        total, known = 0.0, False
        for provider_id, capacity in providers:
            mean = self._mean.get(provider_id)
            if mean is not None and capacity > 0:
                total += capacity / mean
                known = True
        return total if known else None

    def wait(self, ahead: int, providers: Iterable[tuple[str, int]]) -> float | None:
        """Seconds until a request with ``ahead`` competing waiters before it is admitted."""
        rate = self.rate(providers)
        return None if rate is None else (ahead + 1) / rate


def retry_after(seconds: float | None) -> int:
    """``Retry-After`` (whole seconds, 1..60) for a refusal whose queue drains in ``seconds``
    (unknown: the shortest)."""
    if seconds is None or not math.isfinite(seconds):
        return RETRY_AFTER_MIN_S
    return max(RETRY_AFTER_MIN_S, min(RETRY_AFTER_MAX_S, math.ceil(seconds)))
