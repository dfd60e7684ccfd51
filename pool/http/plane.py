"""``DataPlane``: what the public surface needs from the running Edge (docs/architecture.md).

``iop_site.runtime.EdgeRuntime`` is the one implementation; tests may hand in their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from catalog.config import EdgeSnapshot
from edgekit.loop_lag import LoopLagSampler
from nodes.hub import NodeHub
from pool.engine import PoolEngine
from pool.gate.counters import GateCounts
from pool.http.managed import ManagedKeys
from pool.metering import UsageMeter


class RetryCounter(Protocol):
    """Counts requests sent to another provider before the first byte (R-HEALTH-1)."""

    @property
    def retries(self) -> Mapping[tuple[str, str], int]:
        """(model group, provider that failed) -> count."""
        ...

    def retried(self, model: str, provider_id: str) -> None: ...


class DataPlane(Protocol):
    @property
    def snapshot(self) -> EdgeSnapshot: ...

    started_at: float  # epoch seconds, for /v1/models ``created`` and the start-time gauge
    draining: bool  # True while stopping: no new request is admitted
    pool: PoolEngine
    hub: NodeHub
    meter: UsageMeter
    loop_lag: LoopLagSampler  # how late the event loop runs, for /metrics
    gate: GateCounts  # Stream Evidence Gate outcomes per provider (R-SEG-6)
    managed_keys: ManagedKeys | None  # managed mode's keys and route table (R-MGD-7, 12)

    @property
    def health(self) -> RetryCounter: ...
