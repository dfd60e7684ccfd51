"""The runtime's side of provider health (R-HEALTH-2, R-HEALTH-4), owned by ``EdgeRuntime``.

The engine never sleeps: this timer wakes it when the earliest ejection ends, so that
provider gets its one trial request and the queue is pumped. It also counts retries before
the first byte (R-HEALTH-1) for ``/metrics`` (it is the ``pool.http.plane.RetryCounter``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from pool.engine import PoolEngine


class HealthWatch:
    """One per Edge runtime; every method runs on the event loop's thread."""

    def __init__(self, pool: PoolEngine, clock: Callable[[], float] = time.monotonic) -> None:
        self._pool = pool
        self._clock = clock
        self._handle: asyncio.TimerHandle | None = None
        self._at: float | None = None
        self.retries: dict[tuple[str, str], int] = {}  # (model group, provider that failed)
        pool.on_health_change = self.rearm

    def retried(self, model: str, provider_id: str) -> None:
        """A request left ``provider_id`` for another provider of ``model`` (a configured id)."""
        key = (model, provider_id)
        self.retries[key] = self.retries.get(key, 0) + 1

    def rearm(self) -> None:
        """Keep exactly one timer, set for the end of the earliest ejection."""
        when = self._pool.next_wake()
        if when == self._at:
            return
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._at = when
        if when is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop yet (an apply at start): nothing can be ejected then
            self._at = None
            return
        self._handle = loop.call_later(max(0.0, when - self._clock()), self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._at = None
        self._pool.wake()  # re-arms through on_health_change
        self.rearm()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._at = None
