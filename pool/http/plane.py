"""``DataPlane``: what the public surface needs from the running Edge (docs/architecture.md).

``iop_site.runtime.EdgeRuntime`` is the one implementation; tests may hand in their own.
"""

from __future__ import annotations

from typing import Protocol

from catalog.config import EdgeSnapshot
from nodes.hub import NodeHub
from pool.engine import ProviderPool
from pool.metering import UsageMeter


class DataPlane(Protocol):
    @property
    def snapshot(self) -> EdgeSnapshot: ...

    started_at: float  # epoch seconds, for /v1/models ``created`` and the start-time gauge
    draining: bool  # True while stopping: no new request is admitted
    pool: ProviderPool
    hub: NodeHub
    meter: UsageMeter
