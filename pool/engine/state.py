"""Mutable bookkeeping of the core: per-provider ledger rows, waiters and their wait classes."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

# A wait class groups waiters that share (model, needs, long, excluded providers): they have
# the same candidates, so candidates are evaluated once per class, not once per waiter. The
# exclusion set is empty except for a retry before the first byte (R-HEALTH-1) and a gate
# recovery (R-SEG-6).
ClassKey = tuple[str, frozenset[str], bool, frozenset[str]]

HEALTHY, EJECTED, PROBING = "healthy", "ejected", "probing"  # R-HEALTH-2, R-HEALTH-4


class ProviderState:
    """Ledger row keyed by (node_id, provider_id): policy figures plus live counters (R-POOL-2)."""

    __slots__ = (
        "capabilities",
        "capacity",
        "classes",
        "configured",
        "ejections",
        "enabled",
        "failures",
        "fingerprint",
        "health",
        "in_flight",
        "last_pick",
        "limit",
        "live",
        "long_capacity",
        "long_in_flight",
        "node_id",
        "priority",
        "provider_id",
        "reason",
        "trial",
        "until",
    )

    def __init__(self, node_id: str, provider_id: str) -> None:
        self.node_id = node_id
        self.provider_id = provider_id
        self.capacity = 0
        self.long_capacity = 0
        self.priority = 0
        self.enabled = False
        self.capabilities: frozenset[str] = frozenset()
        self.configured = False  # False once apply removed it; kept only while leases remain
        self.live = False  # node dispatch-ready, configured, enabled, capacity >= 1 (R-POOL-1)
        self.in_flight = 0  # normal + long leases across every model group (R-POOL-2)
        self.long_in_flight = 0
        self.last_pick = 0  # pick sequence of the last grant; oldest wins ties (round-robin)
        self.classes: set[WaitClass] = set()  # wait classes that list this provider
        # Health (R-HEALTH-2): an ejected row is not live; a probing row lets one trial through.
        self.limit = 0  # slots selection may fill: capacity, or 0 while a trial is out
        self.health = HEALTHY
        self.failures = 0  # consecutive failures before the first byte
        self.ejections = 0  # ejections since the last success: the backoff exponent
        self.until = 0.0  # clock time an ejection ends
        self.reason = ""  # why the row is not healthy (no upstream address)
        self.trial = 0  # request id of the half-open trial lease, 0 = none out
        self.fingerprint = ""  # address and profile; a change resets health


class Waiter:
    """One queued request; ``handle`` is owned by the sink (the async wrapper keeps a future)."""

    __slots__ = (
        "affinity",
        "cls",
        "enqueued_at",
        "handle",
        "long",
        "model",
        "owner",
        "request_id",
        "seq",
    )

    def __init__(
        self,
        seq: int,
        request_id: int,
        model: str,
        long: bool,
        at: float,
        cls: WaitClass,
        owner: str | None = None,
    ) -> None:
        self.seq = seq  # global enqueue order (R-POOL-5)
        self.request_id = request_id
        self.model = model
        self.long = long
        self.enqueued_at = at
        self.cls = cls
        self.owner = owner  # the caller's token ref, counted against its queue share (R-PRIN-3)
        self.handle: object = None
        self.affinity: tuple[str, float] | None = None  # (key, ttl_s): R-AFF-1


class WaitClass:
    """Waiters of one ClassKey in enqueue order plus their current live candidates."""

    __slots__ = ("candidates", "excluded", "key", "long", "waiters")

    def __init__(self, key: ClassKey, candidates: tuple[ProviderState, ...]) -> None:
        self.key = key
        self.long = key[2]
        self.excluded = key[3]
        self.candidates = candidates
        # OrderedDict: O(1) peek/pop at the head and O(1) removal of a cancelled waiter.
        self.waiters: OrderedDict[int, Waiter] = OrderedDict()


def select(candidates: Sequence[ProviderState], long: bool) -> ProviderState | None:
    """Pick the candidate with room: lowest in-flight, then lowest priority, then round-robin.

    R-POOL-3. ``limit`` is the capacity, or 0 while a half-open trial is out (R-HEALTH-2);
    ejected rows are never candidates, so health costs nothing here. Round-robin is "least
    recently picked first"; providers never picked tie-break on (node_id, provider_id) so
    the choice never depends on mapping order. A long request
    needs a long slot and a normal slot (R-POOL-7). O(len(candidates)). Locality (R-SCALE-5,
    a Node connected to the asking Edge first among equals) is a no-op here: every ready Node
    of the in-memory engine is connected to its one Edge (the Redis engine's ``select`` has it).
    """
    best: ProviderState | None = None
    for s in candidates:
        flight = s.in_flight
        if flight >= s.limit or (long and s.long_in_flight >= s.long_capacity):
            continue
        if best is not None and (
            flight > best.in_flight or (flight == best.in_flight and _loses_tie(s, best))
        ):
            continue
        best = s
    return best


def _loses_tie(s: ProviderState, best: ProviderState) -> bool:
    """Equal in-flight: higher priority value loses, then the more recently picked one."""
    if s.priority != best.priority:
        return s.priority > best.priority
    if s.last_pick != best.last_pick:
        return s.last_pick > best.last_pick
    return (s.node_id, s.provider_id) > (best.node_id, best.provider_id)
