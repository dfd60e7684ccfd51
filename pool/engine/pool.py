"""The asyncio face of the pool: a future per waiter and one timer for the earliest deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING

from .core import PoolCore
from .errors import PoolError
from .model import Lease, PoolPolicy, PoolSnapshot
from .state import Waiter

if TYPE_CHECKING:
    from .interface import PoolEngine


class _FutureSink:
    """Resolves each waiter's future; a done future means the caller went away."""

    __slots__ = ()

    def abandoned(self, waiter: Waiter) -> bool:
        fut = waiter.handle
        return isinstance(fut, asyncio.Future) and fut.done()

    def granted(self, waiter: Waiter, lease: Lease) -> None:
        fut = waiter.handle
        assert isinstance(fut, asyncio.Future)  # set right after admit, before any pump
        fut.set_result(lease)

    def failed(self, waiter: Waiter, error: PoolError) -> None:
        fut = waiter.handle
        if isinstance(fut, asyncio.Future) and not fut.done():
            fut.set_exception(error)


class ProviderPool:
    """Provider pool of one Edge process; every method runs on the event loop's thread."""

    def __init__(self, policy: PoolPolicy, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._core = PoolCore(policy, _FutureSink(), clock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        # Called when the earliest end of an ejection may have moved; the runtime's health
        # timer listens (the engine itself never sleeps).
        self.on_health_change: Callable[[], None] | None = None

    async def start(self) -> None:
        """Nothing runs beside the requests in memory (``PoolEngine``)."""

    async def aclose(self) -> None:
        """Nothing to stop in memory (``PoolEngine``)."""

    async def acquire(
        self,
        model: str,
        needs: frozenset[str] = frozenset(),
        *,
        long: bool = False,
        owner: str | None = None,
        max_queued: int | None = None,
        exclude: frozenset[str] = frozenset(),
        on_queued: Callable[[Callable[[], int | None]], None] | None = None,
    ) -> Lease:
        """Lease a provider of ``model`` able to serve ``needs``, waiting in the root queue.

        ``owner`` holds at most ``max_queued`` waiters at once (R-PRIN-3); ``exclude`` names
        providers that already failed this request (R-HEALTH-1) or that a gate recovery may
        not take (R-SEG-6).
        """
        outcome = self._core.admit(model, needs, long, owner, max_queued, exclude)
        if isinstance(outcome, Lease):
            return outcome
        if on_queued is not None:  # R-QUEUE-4: where it stands, asked while it waits
            on_queued(partial(self._core.position, outcome))
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Lease] = loop.create_future()
        outcome.handle = fut
        self._loop = loop
        self._arm()
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.cancelled():
                self._core.cancel(outcome)  # leaves the queue at once; no-op if a pump dropped it
                self._arm()
            elif fut.exception() is None:
                self.release(fut.result())  # granted in the same tick as the cancel: no leak
            raise

    def release(self, lease: Lease) -> bool:
        """Give the lease back; True the first time, False after (R-POOL-9). Synchronous."""
        released = self._core.release(lease)
        if self._timer_at is not None:
            self._arm()
        return released

    def succeeded(self, lease: Lease) -> None:
        """The lease's upstream answered (R-HEALTH-2); call before ``release``."""
        if self._core.succeeded(lease):  # the common case changes nothing: no timer work
            self._health_changed()

    def failed(self, lease: Lease, reason: str, retry_after_s: float | None = None) -> None:
        """The lease's run failed before its first byte (R-HEALTH-2); call before ``release``."""
        if self._core.failed(lease, reason, retry_after_s):
            self._health_changed()

    def probed(self, node_id: str, provider_id: str, ok: bool, reason: str = "") -> None:
        """An active probe's verdict from the provider's Node (R-HEALTH-3)."""
        self._core.probed(node_id, provider_id, ok, reason)
        self._health_changed()

    def wake(self) -> int:
        """Let providers whose ejection is over take a trial request; returns how many."""
        woken = self._core.wake(self._clock())
        self._health_changed()
        return woken

    def next_wake(self) -> float | None:
        """When the earliest ejection ends, on this pool's clock; None when none is ejected."""
        return self._core.next_wake()

    @property
    def ejections_total(self) -> dict[str, int]:
        """Ejections so far per provider id (never decreases)."""
        return self._core.ejections_total

    def node_ready(
        self, node_id: str, generation: int, refused: Mapping[str, str] | None = None
    ) -> None:
        """The node's connection generation acked its config: its providers become live,
        except those it ``refused`` (provider id -> reason, R-TLS-3)."""
        self._core.node_ready(node_id, generation, refused)
        self._arm()

    def node_refused(self, node_id: str, generation: int, refused: Mapping[str, str]) -> None:
        """The ready Node now refuses exactly ``refused`` (reported with a refresh ack)."""
        self._core.node_refused(node_id, generation, refused)
        self._arm()

    def node_gone(self, node_id: str, generation: int) -> None:
        """The node's connection generation ended (ignored when older than the ready one)."""
        self._core.node_gone(node_id, generation)
        self._arm()

    def apply(self, policy: PoolPolicy) -> None:
        """Install a new policy, keeping leases; re-evaluates waiters (R-REF-3)."""
        self._core.apply(policy)
        self._health_changed()

    def expire(self) -> int:
        """Time out overdue waiters now (the timer does this on its own); returns how many."""
        ended = self._core.expire(self._clock())
        self._arm()
        return ended

    def snapshot(self) -> PoolSnapshot:
        """Per-provider figures, queue depth and oldest wait (R-POOL-8)."""
        return self._core.snapshot()

    async def fresh_snapshot(self) -> PoolSnapshot:
        """In memory the snapshot is always current."""
        return self._core.snapshot()

    @property
    def reachable(self) -> bool:
        """Always: the pool lives in this process."""
        return True

    def estimate_wait(
        self, model: str, needs: frozenset[str] = frozenset(), long: bool = False
    ) -> float | None:
        """Seconds a request arriving now would wait; None when unknown (R-QUEUE-3)."""
        return self._core.estimate(model, needs, long)

    def drain_s(self) -> float | None:
        """Seconds until the queue has drained at the measured rates (R-QUEUE-1)."""
        return self._core.drain_s()

    def idle(self) -> bool:
        """No lease and no waiter."""
        return self._core.idle()

    def queued_by(self, owner: str) -> int:
        """Waiters ``owner`` holds in the queue now (R-PRIN-3)."""
        return self._core.queued_by(owner)

    def _health_changed(self) -> None:
        self._arm()  # waiters may have failed at once
        if self.on_health_change is not None:
            self.on_health_change()

    def _arm(self) -> None:
        """Keep exactly one timer, set for the oldest waiter's deadline."""
        when = self._core.next_deadline()
        if when == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = when
        if when is not None and self._loop is not None and not self._loop.is_closed():
            delay = max(0.0, when - self._clock())
            self._timer = self._loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._core.expire(self._clock())
        self._arm()


if TYPE_CHECKING:

    def _is_an_engine(pool: ProviderPool) -> PoolEngine:
        return pool  # mypy checks that ProviderPool satisfies the PoolEngine Protocol
