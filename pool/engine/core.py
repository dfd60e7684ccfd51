"""The synchronous pool core: every admission, dispatch and failure decision, no awaits.

Invariant kept after every public call: no queued waiter is dispatchable (some candidate with
room). So a release of provider P can only unblock waiters that list P, and a new arrival that
finds room takes it without overtaking anyone (R-POOL-5).
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from . import health
from .errors import NotAdmitted, PoolError, QueueFull, QueueTimeout, UnknownModel
from .estimate import ServiceTimes
from .health import HealthLedger
from .model import HealthPolicy, Lease, PoolPolicy, PoolSnapshot, ProviderStatus
from .readiness import Readiness
from .state import (
    EJECTED,
    HEALTHY,
    PROBING,
    ClassKey,
    ProviderState,
    WaitClass,
    Waiter,
    select,
)

NO_EXCLUSION: frozenset[str] = frozenset()


class WaiterSink(Protocol):
    """Receives the fate of queued waiters; must not call back into the core."""

    def abandoned(self, waiter: Waiter) -> bool:
        """True when the caller already went away: the waiter is dropped, never dispatched."""
        ...

    def granted(self, waiter: Waiter, lease: Lease) -> None:
        """The waiter was dispatched on ``lease``."""
        ...

    def failed(self, waiter: Waiter, error: PoolError) -> None:
        """The waiter ended with ``error`` (timeout or unavailable)."""
        ...


class PoolCore(HealthLedger):
    """Leases, node readiness and the global waiter queue; see ``docs/pool.md``."""

    def __init__(
        self, policy: PoolPolicy, sink: WaiterSink, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._sink = sink
        self._clock = clock  # must never go backwards: deadlines follow enqueue order
        self._states: dict[tuple[str, str], ProviderState] = {}
        self._by_pid: dict[str, ProviderState] = {}
        self._groups: dict[str, tuple[str, ...]] = {}
        self._max_queue = 1
        self._timeout = 0.0  # seconds; 0 = none
        self._nodes = Readiness()  # ready generations and refusals (R-NODE-1, R-TLS-3)
        self._cands: dict[ClassKey, tuple[ProviderState, ...]] = {}  # admitted keys only
        self._classes: dict[ClassKey, WaitClass] = {}  # non-empty wait classes
        self._queue: OrderedDict[int, Waiter] = OrderedDict()  # global enqueue order
        self._queued_by: dict[str, int] = {}  # owner -> waiters queued (R-PRIN-3)
        self._seq = 0
        self._request_ids = 0
        self._picks = 0
        self._in_flight = 0
        self._health = HealthPolicy()
        self._ejected: dict[tuple[str, str], ProviderState] = {}  # rows out until ``until``
        self.ejections_total: dict[str, int] = {}  # provider id -> ejections (a counter)
        self.service = ServiceTimes(clock)  # lease durations: the wait estimate (R-QUEUE-3)
        self._install(policy)
        self._reevaluate()

    # --- admission and release -------------------------------------------------------------

    def admit(
        self,
        model: str,
        needs: frozenset[str],
        long: bool,
        owner: str | None = None,
        max_queued: int | None = None,
        exclude: frozenset[str] = NO_EXCLUSION,
    ) -> Lease | Waiter:
        """Lease a provider now, or queue a waiter; raise a PoolError when neither is allowed.

        ``owner`` may hold at most ``max_queued`` waiters in the one queue (R-PRIN-3); the
        queue order itself does not depend on owners. ``exclude`` names providers that
        already failed this request (R-HEALTH-1) or that a gate recovery may not take (R-SEG-6).
        """
        now = self._clock()
        if self._queue and self._timeout:
            self.expire(now)  # an overdue waiter must not make the queue look full
        key = (model, needs, long, exclude)
        cands = self._cands.get(key)
        if cands is None:
            cands = self._resolve(key, strict=True)
            self._cands[key] = cands
        if not cands:
            raise self._unavailable(key)  # R-POOL-6, R-HEALTH-2: at once, never queued
        self._request_ids += 1
        chosen = select(cands, long)
        if chosen is not None:
            return self._take(chosen, self._request_ids, model, long)
        if len(self._queue) >= self._max_queue:
            raise QueueFull()  # R-POOL-4
        if (
            owner is not None
            and max_queued is not None
            and self._queued_by.get(owner, 0) >= max_queued
        ):
            raise QueueFull("this token already holds its share of the queue")  # R-PRIN-3
        cls = self._classes.get(key)
        if cls is None:
            cls = WaitClass(key, cands)
            self._classes[key] = cls
            for s in cands:
                s.classes.add(cls)
        self._seq += 1
        waiter = Waiter(self._seq, self._request_ids, model, long, now, cls, owner)
        cls.waiters[waiter.seq] = waiter
        self._queue[waiter.seq] = waiter
        if owner is not None:
            self._queued_by[owner] = self._queued_by.get(owner, 0) + 1
        return waiter

    def release(self, lease: Lease) -> bool:
        """Give the slot back (True) or do nothing for a released lease (False); pumps."""
        if lease._released:
            return False
        lease._released = True
        key = (lease.node_id, lease.provider_id)
        state = self._states.get(key)
        if state is None:  # not a lease of this pool
            return True
        state.in_flight -= 1
        if lease.long:
            state.long_in_flight -= 1
        self._in_flight -= 1
        self.service.took(lease.provider_id, lease.started)
        if state.trial == lease.request_id:  # a trial ended with no verdict: let another through
            state.trial = 0
            if state.health == PROBING:
                state.limit = state.capacity
        if not state.configured:
            if state.in_flight == 0:
                del self._states[key]  # removed by apply; its last lease is now back
        elif state.classes:
            self._pump(list(state.classes))  # only waiters listing this provider can run now
        return True

    def cancel(self, waiter: Waiter) -> bool:
        """Take a waiter out of the queue at once (its caller went away); False if already out."""
        if self._queue.get(waiter.seq) is not waiter:
            return False
        self._unqueue(waiter)
        return True

    def expire(self, now: float | None = None) -> int:
        """End every waiter whose deadline (enqueue time + timeout) has passed; returns how many."""
        if not self._timeout or not self._queue:
            return 0
        if now is None:
            now = self._clock()
        ended = 0
        # Every waiter shares one timeout, so deadlines follow enqueue order: stop at the first
        # waiter still in time.
        while self._queue:
            waiter = next(iter(self._queue.values()))
            if waiter.enqueued_at + self._timeout > now:
                break
            self._unqueue(waiter)
            self._fail(waiter, QueueTimeout())
            ended += 1
        return ended

    def next_deadline(self) -> float | None:
        """When the oldest waiter times out (clock units), or None."""
        if not self._timeout or not self._queue:
            return None
        return next(iter(self._queue.values())).enqueued_at + self._timeout

    # --- nodes and policy ------------------------------------------------------------------

    def node_ready(
        self, node_id: str, generation: int, refused: Mapping[str, str] | None = None
    ) -> None:
        """That node's connection generation is dispatch-ready: its providers become live,
        except those the Node ``refused`` (provider id -> reason, R-TLS-3)."""
        if self._nodes.mark_ready(node_id, generation, refused):
            self._reevaluate()
            self._pump(list(self._classes.values()))

    def node_refused(self, node_id: str, generation: int, refused: Mapping[str, str]) -> None:
        """The ready Node now refuses exactly ``refused`` (after a config refresh)."""
        if self._nodes.mark_refused(node_id, generation, refused):
            self._reevaluate()
            self._pump(list(self._classes.values()))

    def node_gone(self, node_id: str, generation: int) -> None:
        """The connection ended; leases stay counted until their runs release them."""
        if self._nodes.mark_gone(node_id, generation):
            self._reevaluate()
            self._pump(list(self._classes.values()))

    def apply(self, policy: PoolPolicy) -> None:
        """Swap the policy: keep leases, re-evaluate candidates and deadlines (R-REF-3); pump."""
        self._install(policy)
        self._reevaluate()
        self.expire()  # deadlines are enqueue time + the new timeout
        self._pump(list(self._classes.values()))

    # --- views -----------------------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        """Per-provider figures sorted by (node_id, provider_id), queue depth and oldest wait."""
        rows = []
        now = self._clock()
        for key in sorted(k for k, s in self._states.items() if s.configured):
            s = self._states[key]
            refusal = self._nodes.refused.get(s.node_id, {}).get(s.provider_id)
            online = s.node_id in self._nodes.ready and refusal is None
            rows.append(
                ProviderStatus(
                    node_id=s.node_id,
                    provider_id=s.provider_id,
                    online=online,
                    capacity=s.capacity,
                    in_flight=s.in_flight if online else 0,
                    long_in_flight=s.long_in_flight if online else 0,
                    # wait classes are disjoint, so this counts distinct requests (R-POOL-8)
                    queued=sum(len(c.waiters) for c in s.classes) if online else 0,
                    priority=s.priority,
                    enabled=s.enabled,
                    long_capacity=s.long_capacity,
                    unavailable=refusal,
                    health=s.health,
                    health_reason=s.reason,
                    ejected_for_s=max(0.0, s.until - now) if s.health == EJECTED else 0.0,
                    consecutive_failures=s.failures,
                )
            )
        oldest = 0.0
        if self._queue:
            oldest = max(0.0, (now - next(iter(self._queue.values())).enqueued_at) * 1e3)
        return PoolSnapshot(tuple(rows), len(self._queue), oldest)

    def estimate(
        self, model: str, needs: frozenset[str], long: bool, exclude: frozenset[str] = NO_EXCLUSION
    ) -> float | None:
        """Seconds a request of this kind arriving now would wait (R-QUEUE-3): 0 with a free
        slot, else its competing waiters ahead plus itself over its candidates' measured
        completion rate; None when unknown (no candidate, or none measured yet)."""
        key = (model, needs, long, exclude)
        cands = self._cands.get(key)
        if cands is None:
            cands = self._resolve(key, strict=False)
        if not cands:
            return None
        if select(cands, long) is not None:
            return 0.0
        classes = {cls for s in cands for cls in s.classes}  # disjoint: distinct waiters
        ahead = sum(len(cls.waiters) for cls in classes)
        return self.service.wait(ahead, ((s.provider_id, s.capacity) for s in cands))

    def position(self, waiter: Waiter) -> int:
        """1 + the queued waiters ahead of ``waiter`` that compete for its providers
        (R-QUEUE-4); 0 once it is no longer queued."""
        if waiter.seq not in self._queue:
            return 0
        classes = {cls for s in waiter.cls.candidates for cls in s.classes}
        return 1 + sum(1 for cls in classes for seq in cls.waiters if seq < waiter.seq)

    def drain_s(self) -> float | None:
        """Seconds until the whole queue has drained at the measured rates (R-QUEUE-1)."""
        live = ((s.provider_id, s.capacity) for s in self._states.values() if s.live)
        return self.service.wait(len(self._queue), live)

    def idle(self) -> bool:
        """No lease outstanding and no waiter queued."""
        return self._in_flight == 0 and not self._queue

    @property
    def queue_depth(self) -> int:
        """Waiters currently queued."""
        return len(self._queue)

    def queued_by(self, owner: str) -> int:
        """Waiters ``owner`` holds in the queue now (R-PRIN-3)."""
        return self._queued_by.get(owner, 0)

    # --- internals -------------------------------------------------------------------------

    def _take(self, state: ProviderState, request_id: int, model: str, long: bool) -> Lease:
        state.in_flight += 1
        if long:
            state.long_in_flight += 1  # a long request holds a long and a normal slot (R-POOL-7)
        if state.health != HEALTHY and not state.trial:  # the one half-open trial (R-HEALTH-2)
            state.trial = request_id
            state.limit = 0
        self._picks += 1
        state.last_pick = self._picks
        self._in_flight += 1
        return Lease(request_id, state.node_id, state.provider_id, model, long, self._clock())

    def _pump(self, seeds: Iterable[WaitClass]) -> None:
        """Dispatch the earliest dispatchable waiter, repeatedly, among the seed classes.

        R-POOL-5. A class's head is its earliest waiter, so the earliest dispatchable waiter
        overall is the smallest head among classes with room. Room only shrinks during a pump,
        so a class found without room is done for this pump: it never blocks a later class.
        """
        heap = [(next(iter(c.waiters)), c) for c in seeds if c.waiters]
        heapq.heapify(heap)
        while heap:
            _, cls = heapq.heappop(heap)
            chosen = select(cls.candidates, cls.long)
            if chosen is None:
                continue
            _, waiter = cls.waiters.popitem(last=False)
            self._dequeue(waiter)
            if not self._sink.abandoned(waiter):
                self._sink.granted(
                    waiter, self._take(chosen, waiter.request_id, waiter.model, waiter.long)
                )
            if cls.waiters:
                heapq.heappush(heap, (next(iter(cls.waiters)), cls))
            else:
                self._drop_class(cls)

    def _reevaluate(self) -> None:
        """Recompute liveness and every wait class's candidates; strand classes left with none."""
        for s in self._by_pid.values():
            s.live = (
                s.enabled
                and s.capacity >= 1
                and s.node_id in self._nodes.ready
                and s.provider_id not in self._nodes.refused[s.node_id]
                and s.health != EJECTED
            )
        self._cands.clear()
        stranded: list[Waiter] = []
        for cls in list(self._classes.values()):
            for s in cls.candidates:
                s.classes.discard(cls)
            cls.candidates = self._resolve(cls.key, strict=False)
            if cls.candidates:
                for s in cls.candidates:
                    s.classes.add(cls)
            else:
                stranded.extend(cls.waiters.values())
                cls.waiters.clear()
                del self._classes[cls.key]
        stranded.sort(key=lambda w: w.seq)
        for waiter in stranded:
            self._dequeue(waiter)
            # R-POOL-6: at once, not at the timeout
            self._fail(waiter, self._unavailable(waiter.cls.key))

    def _resolve(self, key: ClassKey, *, strict: bool) -> tuple[ProviderState, ...]:
        """Live candidates of a key (R-POOL-1); strict raises UnknownModel / NotAdmitted."""
        model, needs, long, excluded = key
        pids = self._groups.get(model)
        if pids is None:
            if strict:
                raise UnknownModel()
            return ()
        admitted = False
        found: list[ProviderState] = []
        for pid in pids:
            s = self._by_pid.get(pid)
            if s is None or not needs <= s.capabilities:
                continue
            admitted = True  # R-PROF-4: admission looks at every provider, live or not
            if s.live and (not long or s.long_capacity > 0) and pid not in excluded:
                found.append(s)
        if not admitted and strict:
            raise NotAdmitted()
        return tuple(found)

    def _install(self, policy: PoolPolicy) -> None:
        by_pid: dict[str, ProviderState] = {}
        for p in policy.providers:
            key = (p.node_id, p.provider_id)
            state = self._states.get(key)
            if state is None:
                state = self._states[key] = ProviderState(p.node_id, p.provider_id)
            if state.fingerprint != p.fingerprint:
                if state.fingerprint:
                    health.reset(state)  # a new address or profile starts healthy
                state.fingerprint = p.fingerprint
            state.capacity = p.capacity
            state.limit = 0 if state.trial else p.capacity
            state.long_capacity = p.long_capacity
            state.priority = p.priority
            state.enabled = p.enabled
            state.capabilities = p.capabilities
            state.configured = True
            by_pid[p.provider_id] = state
        for key, state in list(self._states.items()):
            if by_pid.get(state.provider_id) is not state:
                state.configured = False  # removed: its leases stay counted until released
                state.live = False
                if state.in_flight == 0:
                    del self._states[key]
        self._by_pid = by_pid
        # Only configured rows wake; one removed and configured again keeps its ejection.
        self._ejected = {
            (s.node_id, s.provider_id): s for s in by_pid.values() if s.health == EJECTED
        }
        self._groups = {model: tuple(pids) for model, pids in policy.groups.items()}
        self._max_queue = policy.max_queue
        self._timeout = policy.queue_timeout_ms / 1000.0
        self._health = policy.health

    def _dequeue(self, waiter: Waiter) -> None:
        """Out of the global queue; the owner's queued count follows (R-PRIN-3)."""
        del self._queue[waiter.seq]
        owner = waiter.owner
        if owner is not None:
            left = self._queued_by[owner] - 1
            if left:
                self._queued_by[owner] = left
            else:
                del self._queued_by[owner]

    def _unqueue(self, waiter: Waiter) -> None:
        self._dequeue(waiter)
        cls = waiter.cls
        del cls.waiters[waiter.seq]
        if not cls.waiters:
            self._drop_class(cls)

    def _drop_class(self, cls: WaitClass) -> None:
        if self._classes.get(cls.key) is cls:
            del self._classes[cls.key]
        for s in cls.candidates:
            s.classes.discard(cls)

    def _fail(self, waiter: Waiter, error: PoolError) -> None:
        if not self._sink.abandoned(waiter):
            self._sink.failed(waiter, error)
