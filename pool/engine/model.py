"""Public value types of the pool: policy in, leases and snapshots out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class PoolProvider:
    """One provider as the pool sees it; capacities are per (node, provider) resource (R-CFG-8)."""

    node_id: str
    provider_id: str
    capacity: int
    long_capacity: int
    priority: int
    enabled: bool
    capabilities: frozenset[str]
    fingerprint: str = ""  # address and profile: a change resets the row's health


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """Passive ejection (R-HEALTH-2); defaults are the documented ones (docs/configuration.md)."""

    eject_after_failures: int = 3  # 0 = never eject
    eject_base_s: float = 10.0
    eject_max_s: float = 300.0

    def __post_init__(self) -> None:
        if self.eject_after_failures < 0 or self.eject_base_s <= 0:
            raise ValueError("eject_after_failures must be >= 0 and eject_base_s > 0")
        if self.eject_max_s < self.eject_base_s:
            raise ValueError("eject_max_s must be >= eject_base_s")

    def backoff(self, ejections: int) -> float:
        """Seconds of the ejection after ``ejections`` earlier ones: base doubling, capped."""
        return min(self.eject_base_s * 2.0 ** min(ejections, 32), self.eject_max_s)


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    """Everything live-appliable the pool needs; swapped whole by ``apply`` (R-REF-3)."""

    providers: tuple[PoolProvider, ...]
    groups: Mapping[str, tuple[str, ...]]  # model group id -> provider ids (order irrelevant)
    max_queue: int  # >= 1; defaults are applied by the config loader (R-CFG-7)
    queue_timeout_ms: int  # 0 = no timeout
    health: HealthPolicy = HealthPolicy()
    version: int = 0  # the active revision id; a shared store keeps the newest (R-SCALE-2)

    def __post_init__(self) -> None:
        if self.max_queue < 1:
            raise ValueError("max_queue must be >= 1")
        if self.queue_timeout_ms < 0:
            raise ValueError("queue_timeout_ms must be >= 0")
        seen: set[str] = set()
        for provider in self.providers:
            if provider.provider_id in seen:  # R-CFG-3: unique across the whole Edge
                raise ValueError(f"duplicate provider id {provider.provider_id!r}")
            seen.add(provider.provider_id)
            if provider.capacity < 0 or provider.long_capacity < 0:
                raise ValueError(f"negative capacity for provider {provider.provider_id!r}")


@dataclass(eq=False, slots=True)
class Lease:
    """One admitted request's slot on (node_id, provider_id); release it exactly once (R-POOL-9)."""

    request_id: int
    node_id: str
    provider_id: str
    model: str
    long: bool
    started: float = 0.0  # on the engine's clock; 0 = not measured (R-QUEUE-3)
    _released: bool = field(default=False, init=False, repr=False)

    @property
    def released(self) -> bool:
        """True once the pool has taken the slot back."""
        return self._released


@dataclass(frozen=True, slots=True)
class ProviderStatus:
    """One provider's row in the snapshot; offline rows report effective figures of 0 (R-POOL-8)."""

    node_id: str
    provider_id: str
    online: bool
    capacity: int
    in_flight: int
    long_in_flight: int
    queued: int
    priority: int
    enabled: bool
    long_capacity: int = 0
    unavailable: str | None = None  # why the Node refused to run it (R-TLS-3)
    health: str = "healthy"  # healthy | ejected | probing (R-HEALTH-4)
    health_reason: str = ""
    ejected_for_s: float = 0.0  # time left of an ejection
    consecutive_failures: int = 0


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """Point-in-time view of the pool for status pages and metrics (R-POOL-8)."""

    providers: tuple[ProviderStatus, ...]
    queue_depth: int
    oldest_wait_ms: float

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with the same field names."""
        return {
            "providers": [asdict(row) for row in self.providers],
            "queue_depth": self.queue_depth,
            "oldest_wait_ms": self.oldest_wait_ms,
        }
