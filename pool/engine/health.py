"""Provider health in the ledger: ejection, backoff, half-open trial, probes (R-HEALTH-2, 3).

Plain functions on one ``ProviderState`` row, and ``HealthLedger``, the pool core's health
operations, which re-evaluate candidates only when liveness changed. Nothing here sleeps:
the runtime's timer calls the core's ``wake`` when ``until`` has passed. Every change of
state is one log line (R-HEALTH-4).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from .errors import Unavailable
from .model import HealthPolicy, Lease
from .state import EJECTED, HEALTHY, PROBING, ClassKey, ProviderState, WaitClass

log = logging.getLogger("iop.pool.health")


def eject(s: ProviderState, policy: HealthPolicy, now: float, reason: str, seconds: float) -> None:
    """Take the row out of selection for ``seconds`` (bounded by ``eject_max_s``)."""
    seconds = max(0.0, min(seconds, policy.eject_max_s))
    before = s.health
    s.health = EJECTED
    s.until = now + seconds
    s.ejections += 1
    s.failures = 0
    s.trial = 0
    s.limit = s.capacity
    s.reason = reason
    log.warning(
        "provider %s (node %s): %s -> ejected for %.0f s: %s",
        s.provider_id, s.node_id, before, seconds, reason,
    )  # fmt: skip


def failure(
    s: ProviderState,
    policy: HealthPolicy,
    now: float,
    reason: str,
    retry_after_s: float | None,
    *,
    trial: bool,
) -> bool:
    """Count a failure before the first byte; True when the row was ejected by it.

    A failed trial ejects again with the doubled backoff; a 429 with ``Retry-After`` ejects
    for that long; otherwise ``eject_after_failures`` in a row eject (0 = never eject).
    """
    if policy.eject_after_failures == 0:
        return False
    if s.health == PROBING:
        if not trial:
            return False  # a lease from before the ejection says nothing about recovery
        seconds = policy.backoff(s.ejections) if retry_after_s is None else retry_after_s
        eject(s, policy, now, f"trial failed: {reason}", seconds)
        return True
    if s.health != HEALTHY:
        return False
    s.failures += 1
    if retry_after_s is not None:
        eject(s, policy, now, reason, retry_after_s)
        return True
    if s.failures >= policy.eject_after_failures:
        count = s.failures
        times = "1 failure" if count == 1 else f"{count} failures"
        eject(s, policy, now, f"{reason} ({times} in a row)", policy.backoff(s.ejections))
        return True
    return False


def start_probing(s: ProviderState) -> None:
    """The ejection is over: the row is a candidate again, for one trial request."""
    s.health = PROBING
    s.trial = 0
    s.limit = s.capacity
    log.info(
        "provider %s (node %s): ejected -> probing: one trial request is let through",
        s.provider_id, s.node_id,
    )  # fmt: skip


def restore(s: ProviderState, how: str) -> None:
    """A success after an ejection: back to healthy, the backoff starts over."""
    before = s.health
    s.health = HEALTHY
    s.failures = 0
    s.ejections = 0
    s.trial = 0
    s.until = 0.0
    s.limit = s.capacity
    s.reason = ""
    log.info("provider %s (node %s): %s -> healthy (%s)", s.provider_id, s.node_id, before, how)


def reset(s: ProviderState) -> None:
    """Forget the row's health (its address or profile changed); logged only if it was not
    healthy."""
    if s.health != HEALTHY:
        restore(s, "its address or profile changed")
    s.failures = 0
    s.ejections = 0


class HealthLedger:
    """The pool core's health operations (R-HEALTH-2, R-HEALTH-3); ``PoolCore`` is the one
    subclass and provides the state and the two re-evaluation steps declared here."""

    _clock: Callable[[], float]
    _health: HealthPolicy
    _states: dict[tuple[str, str], ProviderState]
    _by_pid: dict[str, ProviderState]
    _groups: dict[str, tuple[str, ...]]
    _classes: dict[ClassKey, WaitClass]
    _ejected: dict[tuple[str, str], ProviderState]  # rows out until ``until``
    ejections_total: dict[str, int]  # provider id -> ejections (a counter)

    def _reevaluate(self) -> None:
        raise NotImplementedError

    def _pump(self, seeds: Iterable[WaitClass]) -> None:
        raise NotImplementedError

    def succeeded(self, lease: Lease) -> bool:
        """The lease's run got an answer from its upstream: failures start over; a trial that
        succeeds restores its provider (True). Call before ``release``."""
        s = self._row(lease.node_id, lease.provider_id)
        if s is None or s.health == EJECTED:
            return False
        s.failures = 0
        if s.health == PROBING and s.trial == lease.request_id:
            restore(s, "the trial request succeeded")
            self._pump(list(s.classes))
            return True
        return False

    def failed(self, lease: Lease, reason: str, retry_after_s: float | None = None) -> bool:
        """The lease's run failed before its first byte; True when that ejected the provider.
        Call before ``release``. ``reason`` must not carry an upstream address."""
        s = self._row(lease.node_id, lease.provider_id)
        if s is None:
            return False
        trial = s.trial == lease.request_id
        if failure(s, self._health, self._clock(), reason, retry_after_s, trial=trial):
            self._ejected_now(s)
            return True
        return False

    def probed(self, node_id: str, provider_id: str, ok: bool, reason: str = "") -> None:
        """An active probe's verdict (R-HEALTH-3): it counts like a trial request."""
        s = self._row(node_id, provider_id)
        if s is None:
            return
        now = self._clock()
        if ok:
            if s.health == PROBING or (s.health == EJECTED and s.until <= now):
                was_ejected = s.health == EJECTED
                self._ejected.pop((s.node_id, s.provider_id), None)
                restore(s, "an active probe succeeded")
                if was_ejected:
                    self._reevaluate()
                    self._pump(list(self._classes.values()))
                else:
                    self._pump(list(s.classes))
            elif s.health == HEALTHY:
                s.failures = 0
            return
        if s.health == EJECTED:
            return
        trial = s.health == PROBING
        if failure(s, self._health, now, f"probe failed: {reason}", None, trial=trial):
            self._ejected_now(s)

    def wake(self, now: float | None = None) -> int:
        """Rows whose ejection is over become probing (one trial each); pumps. Returns how
        many. The runtime's timer calls this at ``next_wake``."""
        if not self._ejected:
            return 0
        if now is None:
            now = self._clock()
        due = [s for s in self._ejected.values() if s.until <= now]
        for s in due:
            del self._ejected[(s.node_id, s.provider_id)]
            start_probing(s)
        if due:
            self._reevaluate()
            self._pump(list(self._classes.values()))
        return len(due)

    def next_wake(self) -> float | None:
        """When the earliest ejection ends (clock units), or None."""
        if not self._ejected:
            return None
        return min(s.until for s in self._ejected.values())

    # --- internals -------------------------------------------------------------------------

    def _row(self, node_id: str, provider_id: str) -> ProviderState | None:
        s = self._states.get((node_id, provider_id))
        return s if s is not None and s.configured else None

    def _ejected_now(self, s: ProviderState) -> None:
        self._ejected[(s.node_id, s.provider_id)] = s
        self.ejections_total[s.provider_id] = self.ejections_total.get(s.provider_id, 0) + 1
        self._reevaluate()  # out of every candidate list; waiters left with none fail at once

    def _unavailable(self, key: ClassKey) -> Unavailable:
        """R-HEALTH-2: when ejections leave nothing, the message says why and for how long."""
        now = self._clock()
        ejected = [
            s
            for pid in self._groups.get(key[0], ())
            if (s := self._by_pid.get(pid)) is not None and s.health == EJECTED
        ]
        if not ejected:
            return Unavailable()
        first = min(ejected, key=lambda s: s.until)
        return Unavailable(
            f"every available provider of this model is ejected after upstream failures "
            f"({first.provider_id}: {first.reason}; back in {max(0.0, first.until - now):.0f} s)"
        )
