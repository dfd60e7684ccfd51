"""The Edge's running state: the active snapshot, the pool, the Node hub and the meter.

One object, created once by ``iop_site.server.serve`` and passed to the ASGI apps (it is the
``pool.http.DataPlane`` of the public surface and the ``edgekit.running.RunningEdge`` of the
Django side); apply swaps the snapshot copy-on-write, keeps every lease and re-evaluates the
queue (R-REF-3).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from catalog.config import EdgeSnapshot
from edgekit.loop_lag import INTERVAL_S, LoopLagSampler
from edgekit.running import ApplyOutcome
from iop_site.health import HealthWatch
from nodes.hub import NodeHub
from pool.engine import PoolEngine, ProviderPool
from pool.gate.counters import GateCounts
from pool.metering import UsageMeter
from pool.policy import policy_from_snapshot

__all__ = ["ApplyOutcome", "EdgeRuntime"]


class EdgeRuntime:
    def __init__(
        self,
        snapshot: EdgeSnapshot,
        *,
        clock: Callable[[], float] = time.monotonic,
        heartbeat_interval_s: float = 15.0,
        heartbeat_timeout_s: float = 45.0,
        loop_lag_interval_s: float = INTERVAL_S,
    ) -> None:
        self._snapshot = snapshot
        self.started_at = time.time()
        self.pool: PoolEngine = ProviderPool(policy_from_snapshot(snapshot), clock=clock)
        self.health = HealthWatch(self.pool, clock)
        self.hub = NodeHub(
            lambda: self._snapshot,
            self.pool,
            heartbeat_interval_s=heartbeat_interval_s,
            heartbeat_timeout_s=heartbeat_timeout_s,
            clock=clock,
        )
        self._apply_lock: asyncio.Lock | None = None
        self.draining = False  # set on shutdown: no new request is admitted
        self.meter = UsageMeter(lambda: self._snapshot)
        self.loop_lag = LoopLagSampler(loop_lag_interval_s)
        self.gate = GateCounts()  # Stream Evidence Gate outcomes (R-SEG-6)

    def start(self) -> None:
        """Start what runs beside the requests (the loop-lag sampler); idempotent, call it
        from the running loop."""
        self.loop_lag.start()

    @property
    def snapshot(self) -> EdgeSnapshot:
        return self._snapshot

    def pool_status(self) -> dict[str, Any]:
        """The pool snapshot as a dict (R-POOL-8); call it on the loop that owns the pool."""
        status = self.pool.snapshot().as_dict()
        status["gate"] = self.gate.by_provider()  # Stream Evidence Gate counts (R-SEG-6)
        return status

    def relay_status(self) -> dict[str, int]:
        """Run output received from Nodes and not yet taken by clients (R-IN-5)."""
        total, largest, held = self.hub.relay_buffered()
        return {
            "relay_buffered_bytes": total,
            "relay_buffered_bytes_max": largest,
            "relay_held_streams": held,
        }

    async def apply(self, snapshot: EdgeSnapshot) -> ApplyOutcome:
        """Install an already validated and classified snapshot; applies are serialized."""
        if self._apply_lock is None:
            self._apply_lock = asyncio.Lock()
        async with self._apply_lock:
            # All or nothing: if the policy or the pool refuses it, the old snapshot stays.
            self.pool.apply(policy_from_snapshot(snapshot))
            self._snapshot = snapshot
            pushed = await self.hub.push_refresh()
        return ApplyOutcome(pushed_nodes=tuple(pushed))

    async def aclose(self) -> None:
        self.health.close()
        self.loop_lag.stop()
        await self.hub.aclose()
        await self.pool.aclose()
        await self.meter.aclose()
