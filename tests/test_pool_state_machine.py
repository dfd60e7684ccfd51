"""Random admit / release / cancel / timeout / node / apply / health sequences against a
naive model.

The reference model rescans every waiter after every change, which is slow but obviously
right; the engine must give every request the same fate, in the same order (R-POOL-1..9,
R-REF-3, R-NODE-1/3), and every provider the same health: ejection with backoff, the one
half-open trial, probes, exclusion sets and address resets (R-HEALTH-1..3). Requests carry
an owner token with a live queue share (R-PRIN-3): the one FIFO is unchanged, an owner over
its share is refused with ``queue_full``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pool.engine import (
    HealthPolicy,
    Lease,
    NotAdmitted,
    PoolCore,
    PoolError,
    PoolPolicy,
    PoolProvider,
    QueueFull,
    QueueTimeout,
    Unavailable,
    UnknownModel,
    Waiter,
)
from tests.support.examples import SLOW_PROPERTY_TIMEOUT_S, examples

NODES = ("n1", "n2")
PIDS = ("p1", "p2", "p3", "p4")
GROUPS = {"m1": ("p1", "p2", "p3"), "m2": ("p3", "p4"), "m3": ("p2", "p4")}
CAPS = ("chat", "tools")
OWNERS = (None, "tok-a", "tok-b")
# Times are binary fractions of a second in whole milliseconds, so a float clock and a Redis
# millisecond clock agree exactly (tests/test_pool_redis_state_machine.py).
TIMEOUTS_MS = (0, 125, 375)

Key = tuple[str, str]


@dataclass
class RefWaiter:
    n: int
    model: str
    needs: frozenset[str]
    long: bool
    at: float
    owner: str | None = None
    exclude: frozenset[str] = frozenset()
    affinity: tuple[str, float] | None = None  # (key, ttl_s): R-AFF-1


@dataclass
class RefHealth:
    """One provider's health, written out longhand (R-HEALTH-2)."""

    fingerprint: str
    state: str = "healthy"
    failures: int = 0
    ejections: int = 0
    until: float = 0.0
    trial: int | None = None  # request number of the trial lease


@dataclass
class RefPool:
    """Obvious implementation of the rules; O(everything) per step on purpose."""

    policy: PoolPolicy
    now: float = 0.0
    counts: dict[Key, list[int]] = field(default_factory=dict)
    last_pick: dict[Key, int] = field(default_factory=dict)
    picks: int = 0
    ready: dict[str, int] = field(default_factory=dict)
    gone: dict[str, int] = field(default_factory=dict)
    elsewhere: set[str] = field(default_factory=set)  # ready on another Edge (R-SCALE-5)
    waiters: list[RefWaiter] = field(default_factory=list)
    events: list[tuple[object, ...]] = field(default_factory=list)
    health: dict[Key, RefHealth] = field(default_factory=dict)
    affinity: dict[str, tuple[str, float]] = field(default_factory=dict)  # key -> (pid, until)

    def __post_init__(self) -> None:
        self.install_health()

    def provider(self, pid: str) -> PoolProvider | None:
        return next((p for p in self.policy.providers if p.provider_id == pid), None)

    def hp(self, p: PoolProvider) -> RefHealth:
        return self.health[(p.node_id, p.provider_id)]

    def online(self, node: str) -> bool:
        return node in self.ready or node in self.elsewhere

    def live(self, p: PoolProvider) -> bool:
        ready = p.enabled and p.capacity >= 1 and self.online(p.node_id)
        return ready and self.hp(p).state != "ejected"

    def candidates(
        self, model: str, needs: frozenset[str], long: bool, exclude: frozenset[str] = frozenset()
    ) -> list[PoolProvider]:
        found = []
        for pid in self.policy.groups.get(model, ()):
            p = self.provider(pid)
            if (
                p
                and needs <= p.capabilities
                and self.live(p)
                and (not long or p.long_capacity)
                and pid not in exclude
            ):
                found.append(p)
        return found

    def flight(self, p: PoolProvider) -> list[int]:
        return self.counts.setdefault((p.node_id, p.provider_id), [0, 0])

    def choose(self, cands: list[PoolProvider], long: bool) -> PoolProvider | None:
        def has_room(p: PoolProvider) -> bool:
            f, lf = self.flight(p)
            h = self.hp(p)
            limit = 0 if h.state == "probing" and h.trial is not None else p.capacity
            return f < limit and (not long or lf < p.long_capacity)

        def rank(p: PoolProvider) -> tuple[int, int, bool, int, str, str]:
            key = (p.node_id, p.provider_id)
            remote = p.node_id in self.elsewhere  # R-SCALE-5: this Edge's Nodes first
            return (self.flight(p)[0], p.priority, remote, self.last_pick.get(key, 0), *key)

        return min((p for p in cands if has_room(p)), key=rank, default=None)

    def take(self, p: PoolProvider, long: bool, n: int) -> Key:
        counts = self.flight(p)
        assert counts[0] < p.capacity and (not long or counts[1] < p.long_capacity)
        counts[0] += 1
        counts[1] += long
        self.picks += 1
        key = (p.node_id, p.provider_id)
        self.last_pick[key] = self.picks
        h = self.hp(p)
        if h.state == "probing" and h.trial is None:
            h.trial = n
        return key

    # --- health, longhand (R-HEALTH-2, R-HEALTH-3) --------------------------------------------

    def install_health(self) -> None:
        for p in self.policy.providers:
            key = (p.node_id, p.provider_id)
            h = self.health.get(key)
            if h is None:
                self.health[key] = RefHealth(p.fingerprint)
            elif h.fingerprint != p.fingerprint:
                self.health[key] = RefHealth(p.fingerprint)  # a new address starts healthy

    def eject(self, h: RefHealth, seconds: float) -> None:
        hp = self.policy.health
        h.state, h.until = "ejected", self.now + min(seconds, hp.eject_max_s)
        h.ejections += 1
        h.failures, h.trial = 0, None
        self.strand()

    def backoff(self, h: RefHealth) -> float:
        hp = self.policy.health
        return min(hp.eject_base_s * 2**h.ejections, hp.eject_max_s)

    def restore(self, h: RefHealth) -> None:
        h.state, h.failures, h.ejections, h.until, h.trial = "healthy", 0, 0, 0.0, None
        self.pump()

    def configured(self, key: Key) -> RefHealth | None:
        p = self.provider(key[1])
        return self.health[key] if p is not None and (p.node_id, p.provider_id) == key else None

    def failed(self, key: Key, n: int | None, retry_after: float | None) -> None:
        h = self.configured(key)
        if h is None or not self.policy.health.eject_after_failures:
            return
        if h.state == "probing":
            if n is not None and h.trial != n:
                return
            self.eject(h, self.backoff(h) if retry_after is None else retry_after)
        elif h.state == "healthy":
            h.failures += 1
            if retry_after is not None:
                self.eject(h, retry_after)
            elif h.failures >= self.policy.health.eject_after_failures:
                self.eject(h, self.backoff(h))

    def succeeded(self, key: Key, n: int) -> None:
        h = self.configured(key)
        if h is None or h.state == "ejected":
            return
        h.failures = 0
        if h.state == "probing" and h.trial == n:
            self.restore(h)

    def probed(self, key: Key, ok: bool) -> None:
        h = self.configured(key)
        if h is None:
            return
        if ok:
            if h.state == "probing" or (h.state == "ejected" and h.until <= self.now):
                self.restore(h)
            elif h.state == "healthy":
                h.failures = 0
        elif h.state != "ejected":
            self.failed(key, None, None)

    def wake(self) -> None:
        woke = False
        for p in self.policy.providers:
            h = self.hp(p)
            if h.state == "ejected" and h.until <= self.now:
                h.state, h.trial = "probing", None
                woke = True
        if woke:
            self.pump()

    def admit(
        self,
        n: int,
        model: str,
        needs: frozenset[str],
        long: bool,
        owner: str | None = None,
        share: int | None = None,
        exclude: frozenset[str] = frozenset(),
        affinity: tuple[str, float] | None = None,
    ) -> object:
        if self.waiters and self.policy.queue_timeout_ms:
            self.expire()
        if model not in self.policy.groups:
            return UnknownModel
        members = [self.provider(pid) for pid in self.policy.groups[model]]
        if not any(p and needs <= p.capabilities for p in members):
            return NotAdmitted
        cands = self.candidates(model, needs, long, exclude)
        if not cands:
            return Unavailable
        chosen = self.choose(cands, long)
        if affinity is not None:  # R-AFF-1: the last provider of the key, if it has room
            pid, until = self.affinity.get(affinity[0], ("", 0.0))
            last = next((p for p in cands if p.provider_id == pid), None)
            if until > self.now and last is not None and self.choose([last], long) is not None:
                chosen = last
        if chosen is not None:
            if affinity is not None:
                self.affinity[affinity[0]] = (chosen.provider_id, self.now + affinity[1])
            return self.take(chosen, long, n)
        if len(self.waiters) >= self.policy.max_queue:
            return QueueFull
        queued = sum(w.owner == owner for w in self.waiters)
        if owner is not None and share is not None and queued >= share:
            return QueueFull  # R-PRIN-3: the owner's share, the queue itself unchanged
        self.waiters.append(RefWaiter(n, model, needs, long, self.now, owner, exclude, affinity))
        return None

    def release(self, key: Key, long: bool, n: int) -> None:
        counts = self.counts[key]
        counts[0] -= 1
        counts[1] -= long
        h = self.health.get(key)
        if h is not None and h.trial == n:
            h.trial = None  # no verdict: the next request is the trial
        self.forget_removed()
        self.pump()

    def forget_removed(self) -> None:
        """A provider gone from the policy with no lease left loses its rotation position."""
        configured = {(p.node_id, p.provider_id) for p in self.policy.providers}
        for key in list(self.counts):
            if key not in configured and self.counts[key][0] == 0:
                del self.counts[key]
                self.last_pick.pop(key, None)
        for key in list(self.health):
            if key not in configured and self.counts.get(key, [0])[0] == 0:
                del self.health[key]  # the row is gone: a provider added again starts afresh

    def cancel(self, n: int) -> None:
        self.waiters = [w for w in self.waiters if w.n != n]

    def expire(self) -> None:
        timeout = self.policy.queue_timeout_ms / 1000.0
        if not timeout:
            return
        while self.waiters and self.waiters[0].at + timeout <= self.now:
            self.events.append(("fail", self.waiters.pop(0).n, QueueTimeout.code))

    def pump(self) -> None:
        progress = True
        while progress:
            progress = False
            for w in self.waiters:  # earliest dispatchable first (R-POOL-5)
                chosen = self.choose(self.candidates(w.model, w.needs, w.long, w.exclude), w.long)
                if chosen is not None:
                    self.waiters.remove(w)
                    if w.affinity is not None:
                        until = self.now + w.affinity[1]
                        self.affinity[w.affinity[0]] = (chosen.provider_id, until)
                    key = self.take(chosen, w.long, w.n)
                    self.events.append(("grant", w.n, *key))
                    progress = True
                    break

    def strand(self) -> None:
        for w in list(self.waiters):
            if not self.candidates(w.model, w.needs, w.long, w.exclude):
                self.waiters.remove(w)
                self.events.append(("fail", w.n, Unavailable.code))

    def node_ready(self, node: str, gen: int) -> None:
        if (node in self.gone and gen <= self.gone[node]) or gen < self.ready.get(node, gen):
            return
        self.ready[node] = gen
        self.elsewhere.discard(node)  # the newest ready wins, whichever Edge it is on
        self.strand()
        self.pump()

    def node_ready_elsewhere(self, node: str) -> None:
        """The Node connected to another Edge (R-SCALE-2): still live, not local."""
        self.elsewhere.add(node)
        self.strand()
        self.pump()

    def node_gone(self, node: str, gen: int) -> None:
        if gen < self.ready.get(node, gen):
            return
        self.gone[node] = max(gen, self.gone.get(node, gen))
        if self.ready.pop(node, None) is not None:
            self.strand()
            self.pump()

    def apply(self, policy: PoolPolicy) -> None:
        self.policy = policy
        self.forget_removed()
        self.install_health()
        self.strand()
        self.expire()
        self.pump()


@st.composite
def policies(draw: st.DrawFn) -> PoolPolicy:
    rows = []
    for pid in PIDS:
        if draw(st.integers(0, 9)) == 0:
            continue  # provider removed from the policy
        cap = draw(st.integers(1, 3))
        rows.append(
            PoolProvider(
                node_id=draw(st.sampled_from(NODES)),
                provider_id=pid,
                capacity=cap,
                long_capacity=draw(st.integers(0, cap)),
                priority=draw(st.integers(0, 2)),
                enabled=draw(st.sampled_from([True, True, True, False])),
                capabilities=frozenset(draw(st.sets(st.sampled_from(CAPS)))),
                fingerprint=draw(st.sampled_from(["a", "a", "a", "b"])),
            )
        )
    return PoolPolicy(
        tuple(rows),
        GROUPS,
        max_queue=draw(st.integers(1, 5)),
        queue_timeout_ms=draw(st.sampled_from(TIMEOUTS_MS)),
        health=draw(HEALTH_POLICIES),
    )


HEALTH_POLICIES = st.builds(
    HealthPolicy,
    eject_after_failures=st.sampled_from([0, 1, 2]),
    eject_base_s=st.sampled_from([0.125, 0.25]),
    eject_max_s=st.sampled_from([0.25, 0.5]),
)

# R-AFF-1: a few conversation keys; a TTL no run of the machine reaches (a Redis key's TTL
# runs on Redis's own clock, not the machine's)
AFFINITY_KEYS = ("conv-1", "conv-2", "conv-3")
AFFINITY_TTL_S = 3600.0
# Every kind of request the rules can make, for the estimate's invariant.
REQUEST_KINDS = [
    (model, frozenset(needs), long, None)
    for model in (*GROUPS, "nope")
    for needs in ((), *((cap,) for cap in CAPS))
    for long in (False, True)
]
REQUESTS = st.tuples(
    st.sampled_from([*GROUPS, *GROUPS, "nope"]),
    st.sets(st.sampled_from(CAPS), max_size=1).map(frozenset),
    st.booleans(),
    st.sampled_from(OWNERS),
)

INITIAL = PoolPolicy(
    tuple(
        PoolProvider(NODES[i // 2], pid, 1 + i % 2, i % 2, i % 2, True, frozenset(CAPS), "a")
        for i, pid in enumerate(PIDS)
    ),
    GROUPS,
    max_queue=4,
    queue_timeout_ms=375,
    health=HealthPolicy(eject_after_failures=1, eject_base_s=0.125, eject_max_s=0.5),
)


class _Sink:
    def __init__(self, machine: PoolMachine) -> None:
        self.machine = machine
        self.abandoned_waiters: set[Waiter] = set()

    def abandoned(self, waiter: Waiter) -> bool:
        return waiter in self.abandoned_waiters

    def granted(self, waiter: Waiter, lease: Lease) -> None:
        self.machine.on_grant(waiter, lease)

    def failed(self, waiter: Waiter, error: PoolError) -> None:
        self.machine.on_end(self.machine.waiting.pop(waiter), ("fail", error.code))


class PoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.sink = _Sink(self)
        self.core = PoolCore(INITIAL, self.sink, clock=lambda: self.now)
        self.ref = RefPool(INITIAL)
        self.n = 0
        self.waiting: dict[Waiter, int] = {}  # queued waiter -> request number
        self.held: list[tuple[int, Lease]] = []
        self.released: list[Lease] = []
        self.fate: dict[int, tuple[object, ...]] = {}
        self.step_events: list[tuple[object, ...]] = []
        self.step_seqs: list[int] = []
        self.gens = dict.fromkeys(NODES, 1)
        self.shares: dict[str, int | None] = {"tok-a": 1, "tok-b": None}  # live, per token
        for node in NODES:
            self.core.node_ready(node, 1)
            self.ref.node_ready(node, 1)

    # --- bookkeeping of outcomes -------------------------------------------------------------

    def on_end(self, n: int, outcome: tuple[object, ...]) -> None:
        assert n not in self.fate, f"request {n} ended twice"
        self.fate[n] = outcome
        if outcome[0] in ("grant", "fail"):
            self.step_events.append((outcome[0], n, *outcome[1:]))

    def on_grant(self, waiter: Waiter, lease: Lease) -> None:
        n = self.waiting.pop(waiter)
        self.step_seqs.append(waiter.seq)
        self.check_within_capacity(lease)
        self.held.append((n, lease))
        self.on_end(n, ("grant", lease.node_id, lease.provider_id))

    def check_within_capacity(self, lease: Lease) -> None:
        row = next(
            r
            for r in self.core.snapshot().providers
            if (r.node_id, r.provider_id) == (lease.node_id, lease.provider_id)
        )
        assert row.in_flight <= row.capacity
        assert not lease.long or row.long_in_flight <= row.long_capacity

    def compare(self) -> None:
        assert self.step_events == self.ref.events
        assert self.step_seqs == sorted(self.step_seqs), "dispatch must follow enqueue order"
        self.step_events, self.ref.events, self.step_seqs = [], [], []

    # --- rules -------------------------------------------------------------------------------

    @rule(requests=st.lists(REQUESTS, min_size=1, max_size=4))
    def admit(self, requests: list[tuple[str, frozenset[str], bool, str | None]]) -> None:
        for model, needs, long, owner in requests:
            self.admit_one(model, needs, long, owner)

    @rule(request=REQUESTS, exclude=st.sets(st.sampled_from(PIDS), min_size=1, max_size=2))
    def admit_retry(
        self, request: tuple[str, frozenset[str], bool, str | None], exclude: set[str]
    ) -> None:
        """R-HEALTH-1: a retry re-enters admission without the providers that failed it."""
        self.admit_one(*request, frozenset(exclude))

    @rule(request=REQUESTS, key=st.sampled_from(AFFINITY_KEYS))
    def admit_with_affinity(
        self, request: tuple[str, frozenset[str], bool, str | None], key: str
    ) -> None:
        """R-AFF-1: the provider that last ran the key wins among free slots, never more."""
        self.admit_one(*request, affinity=(key, AFFINITY_TTL_S))

    def admit_one(
        self,
        model: str,
        needs: frozenset[str],
        long: bool,
        owner: str | None,
        exclude: frozenset[str] = frozenset(),
        affinity: tuple[str, float] | None = None,
    ) -> None:
        self.n += 1
        n = self.n
        share = self.shares.get(owner) if owner is not None else None
        expected = self.ref.admit(n, model, needs, long, owner, share, exclude, affinity)
        try:
            outcome = self.core.admit(model, needs, long, owner, share, exclude, affinity)
        except PoolError as err:
            self.compare()  # expiries triggered by the arrival come first
            assert type(err) is expected
            self.on_end(n, ("error", err.code))
            return
        self.compare()
        if isinstance(outcome, Lease):
            assert expected == (outcome.node_id, outcome.provider_id)
            self.check_within_capacity(outcome)
            self.held.append((n, outcome))
            self.on_end(n, ("lease", outcome.node_id, outcome.provider_id))
        else:
            assert expected is None
            self.waiting[outcome] = n

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 50))
    def release(self, i: int) -> None:
        n, lease = self.held.pop(i % len(self.held))
        assert self.core.release(lease) is True
        self.released.append(lease)
        self.ref.release((lease.node_id, lease.provider_id), lease.long, n)
        self.compare()

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 50), retry_after=st.sampled_from([None, None, 0.125, 1.0]))
    def fail_then_release(self, i: int, retry_after: float | None) -> None:
        """R-HEALTH-2: a failure before the first byte is reported, then the lease released."""
        n, lease = self.held[i % len(self.held)]
        self.core.failed(lease, "upstream answered HTTP 503", retry_after)
        self.ref.failed((lease.node_id, lease.provider_id), n, retry_after)
        self.compare()
        self.release(i)

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 50))
    def succeed_then_release(self, i: int) -> None:
        n, lease = self.held[i % len(self.held)]
        self.core.succeeded(lease)
        self.ref.succeeded((lease.node_id, lease.provider_id), n)
        self.compare()
        self.release(i)

    @rule(pid=st.sampled_from(PIDS), node=st.sampled_from(NODES), ok=st.booleans())
    def probe(self, pid: str, node: str, ok: bool) -> None:
        """R-HEALTH-3: an active probe's verdict, possibly from a node that does not host it."""
        self.core.probed(node, pid, ok, "probe")
        self.ref.probed((node, pid), ok)
        self.compare()

    @rule()
    def health_timer_fires(self) -> None:
        """The runtime's timer: rows whose ejection is over get their trial."""
        self.core.wake(self.now)
        self.ref.wake()
        self.compare()

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 50))
    def release_another(self, i: int) -> None:
        """Releases drive dispatch, so they get a second rule (rules are drawn uniformly)."""
        self.release(i)

    @precondition(lambda self: self.released)
    @rule(i=st.integers(0, 50))
    def release_again(self, i: int) -> None:
        assert self.core.release(self.released[i % len(self.released)]) is False

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 50))
    def cancel(self, i: int) -> None:
        waiter, n = list(self.waiting.items())[i % len(self.waiting)]
        del self.waiting[waiter]
        assert self.core.cancel(waiter) is True
        assert self.core.cancel(waiter) is False
        self.ref.cancel(n)
        self.on_end(n, ("cancelled",))

    @precondition(lambda self: self.waiting and self.held)
    @rule(i=st.integers(0, 50), j=st.integers(0, 50))
    def cancel_in_dispatch_tick(self, i: int, j: int) -> None:
        """The caller goes away, then a release pumps before the cancel is processed."""
        waiter, n = list(self.waiting.items())[i % len(self.waiting)]
        del self.waiting[waiter]
        self.sink.abandoned_waiters.add(waiter)
        self.on_end(n, ("cancelled",))
        self.ref.cancel(n)
        m, lease = self.held.pop(j % len(self.held))
        self.core.release(lease)
        self.released.append(lease)
        self.ref.release((lease.node_id, lease.provider_id), lease.long, m)
        self.core.cancel(waiter)  # the cancelled task's cleanup, True or False
        self.compare()

    @rule(dt=st.sampled_from([0.125, 0.25, 0.5]), timer_fires=st.booleans())
    def advance(self, dt: float, timer_fires: bool) -> None:
        """Time passes; the deadline timer may not have run yet when the next event comes."""
        self.now += dt
        self.ref.now = self.now
        if timer_fires:
            self.core.expire(self.now)
            self.ref.expire()
            self.compare()
            self.core.wake(self.now)  # the health timer is due as well
            self.ref.wake()
        self.compare()

    @rule(node=st.sampled_from(NODES), delta=st.integers(-1, 1))
    def node_ready(self, node: str, delta: int) -> None:
        self.gens[node] = max(0, self.gens[node] + delta)
        self.core.node_ready(node, self.gens[node])
        self.ref.node_ready(node, self.gens[node])
        self.compare()

    @rule(node=st.sampled_from(NODES), delta=st.integers(-1, 1))
    def node_gone(self, node: str, delta: int) -> None:
        gen = max(0, self.gens[node] + delta)
        self.core.node_gone(node, gen)
        self.ref.node_gone(node, gen)
        self.compare()

    @rule(policy=policies())
    def apply(self, policy: PoolPolicy) -> None:
        self.core.apply(policy)
        self.ref.apply(policy)
        self.compare()

    @rule(timeout_ms=st.sampled_from(TIMEOUTS_MS), max_queue=st.integers(1, 5))
    def apply_queue_policy(self, timeout_ms: int, max_queue: int) -> None:
        """Only the root queue policy changes: deadlines move, waiters stay (R-REF-3)."""
        policy = replace(self.ref.policy, queue_timeout_ms=timeout_ms, max_queue=max_queue)
        self.core.apply(policy)
        self.ref.apply(policy)
        self.compare()

    @rule(owner=st.sampled_from(OWNERS[1:]), share=st.sampled_from([None, 1, 2, 3]))
    def change_share(self, owner: str, share: int | None) -> None:
        """A token's ``max_queued`` changes live: waiters already queued stay (R-PRIN-3)."""
        self.shares[owner] = share

    # --- invariants --------------------------------------------------------------------------

    @invariant()
    def queued_counts_match_model(self) -> None:
        for owner in OWNERS[1:]:
            assert self.core.queued_by(owner) == sum(w.owner == owner for w in self.ref.waiters)

    @invariant()
    def snapshot_matches_model(self) -> None:
        snap = self.core.snapshot()
        ref = self.ref
        assert snap.queue_depth == len(ref.waiters) == len(self.waiting)
        assert [(r.node_id, r.provider_id) for r in snap.providers] == sorted(
            (p.node_id, p.provider_id) for p in ref.policy.providers
        )
        for row in snap.providers:
            p = ref.provider(row.provider_id)
            assert p is not None and row.capacity == p.capacity and row.priority == p.priority
            online = ref.online(row.node_id)
            f, lf = ref.counts.get((row.node_id, row.provider_id), [0, 0])
            queued = sum(
                p in ref.candidates(w.model, w.needs, w.long, w.exclude) for w in ref.waiters
            )
            assert row.online is online
            h = ref.hp(p)
            assert (row.health, row.consecutive_failures) == (h.state, h.failures)
            assert row.ejected_for_s == (max(0.0, h.until - ref.now) if h.state == "ejected" else 0)
            assert (row.in_flight, row.long_in_flight, row.queued) == (
                (f, lf, queued) if online else (0, 0, 0)
            )

    @invariant()
    def no_waiter_left_dispatchable(self) -> None:
        for w in self.ref.waiters:
            cands = self.ref.candidates(w.model, w.needs, w.long, w.exclude)
            assert self.ref.choose(cands, w.long) is None

    @invariant()
    def positions_and_free_slots_match_model(self) -> None:
        """R-QUEUE-4: a queued waiter's position is 1 + the earlier waiters that compete for
        one of its candidates; R-QUEUE-3: the estimate is 0 exactly when a request of that
        kind would be leased now (whatever the measured rates)."""
        ref = self.ref
        cands = {w.n: ref.candidates(w.model, w.needs, w.long, w.exclude) for w in ref.waiters}
        for waiter, n in self.waiting.items():
            i = next(k for k, w in enumerate(ref.waiters) if w.n == n)
            mine = {p.provider_id for p in cands[n]}
            ahead = sum(bool(mine & {p.provider_id for p in cands[w.n]}) for w in ref.waiters[:i])
            assert self.core.position(waiter) == 1 + ahead
        for model, needs, long, _ in REQUEST_KINDS:
            free = ref.choose(ref.candidates(model, needs, long), long) is not None
            assert (self.core.estimate(model, needs, long) == 0.0) is free

    @invariant()
    def idle_means_all_zero(self) -> None:
        idle = self.core.idle()
        assert idle == (not self.held and not self.waiting)
        if idle:
            snap = self.core.snapshot()
            assert snap.queue_depth == 0 and snap.oldest_wait_ms == 0
            assert all(r.in_flight == r.long_in_flight == r.queued == 0 for r in snap.providers)

    def teardown(self) -> None:
        """Drain: cancel every waiter, release every lease; every request ended exactly once."""
        for waiter, n in list(self.waiting.items()):
            assert self.core.cancel(waiter)
            self.on_end(n, ("cancelled",))
        self.waiting.clear()
        while self.held:
            _, lease = self.held.pop()
            assert self.core.release(lease)
        assert self.core.idle()
        assert all(self.core.queued_by(owner) == 0 for owner in OWNERS[1:])
        assert sorted(self.fate) == list(range(1, self.n + 1))
        snap = self.core.snapshot()
        assert all(r.in_flight == r.long_in_flight == r.queued == 0 for r in snap.providers)


PoolMachine.TestCase.settings = settings(
    max_examples=examples(200),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_pool_engine_matches_reference_model = pytest.mark.timeout(SLOW_PROPERTY_TIMEOUT_S)(
    PoolMachine.TestCase
)
