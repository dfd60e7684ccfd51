"""The Edge's running state: the active snapshot, the pool, the Node hub and the meter.

One object, created once by ``iop_site.server.serve`` and passed to the ASGI apps (it is the
``pool.http.DataPlane`` of the public surface and the ``edgekit.running.RunningEdge`` of the
Django side); apply swaps the snapshot copy-on-write, keeps every lease and re-evaluates the
queue (R-REF-3).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from catalog.config import EdgeSnapshot
from edgekit.loop_lag import INTERVAL_S, LoopLagSampler
from edgekit.running import ApplyOutcome
from iop_site.health import HealthWatch
from nodes.hub import NodeHub
from pool.engine import PoolEngine, ProviderPool
from pool.gate.counters import GateCounts
from pool.http.managed import ManagedKeys
from pool.metering import UsageMeter
from pool.policy import group_queues, policy_from_snapshot

__all__ = ["ApplyOutcome", "EdgeRuntime"]

log = logging.getLogger("iop.edge")


class EdgeRuntime:
    def __init__(
        self,
        snapshot: EdgeSnapshot,
        *,
        revision: int | None = None,
        pool: PoolEngine | None = None,
        clock: Callable[[], float] = time.monotonic,
        heartbeat_interval_s: float = 15.0,
        heartbeat_timeout_s: float = 45.0,
        loop_lag_interval_s: float = INTERVAL_S,
        managed_keys: ManagedKeys | None = None,
    ) -> None:
        self._snapshot = snapshot
        # Managed mode: the key files read once at start and the route table (R-MGD-7, 12).
        self.managed_keys = managed_keys
        self.revision = revision  # the active revision this Edge runs (None: not from one)
        self.started_at = time.time()
        self.pool: PoolEngine = (
            pool
            if pool is not None
            else ProviderPool(policy_from_snapshot(snapshot, version=revision or 0), clock=clock)
        )
        # Started with the runtime, closed after it in reverse (scale-out: iop_site.scale).
        self.companions: list[Any] = []
        self.tracing: Any = None  # obskit.otel.Tracing while OTEL_* asks for traces (R-OBS-2)
        # Scale-out: per-token limits counted in Redis across Edges (R-SCALE-6), else None.
        self.shared_limits: Any = None
        self._started: list[Any] = []
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
        if managed_keys is not None:  # R-MGD-13: route keys metered as their principal's
            self.meter.route_labels = managed_keys.route_labels
        self.loop_lag = LoopLagSampler(loop_lag_interval_s)
        self.gate = GateCounts()  # Stream Evidence Gate outcomes (R-SEG-6)

    def start(self) -> None:
        """Start what runs beside the requests (the loop-lag sampler); idempotent, call it
        from the running loop."""
        self.loop_lag.start()

    async def start_companions(self) -> None:
        """Start the companions in order; one that fails is raised after the started ones
        are closed again."""
        for part in self.companions:
            if part in self._started:
                continue
            try:
                await part.start()
            except BaseException:
                await self._close_companions()
                raise
            self._started.append(part)

    async def _close_companions(self) -> None:
        while self._started:
            part = self._started.pop()
            try:
                await part.aclose()
            except Exception as exc:  # one that fails to close must not keep the rest open
                log.error("closing %s failed: %s", type(part).__name__, type(exc).__name__)

    @property
    def snapshot(self) -> EdgeSnapshot:
        return self._snapshot

    async def pool_status(self) -> dict[str, Any]:
        """The pool snapshot as a dict (R-POOL-8), at most the engine's stated age old
        (R-SCALE-8); call it on the loop that owns the pool. ``PoolBackendUnavailable`` when
        the shared pool cannot be read in time."""
        snapshot = await self.pool.fresh_snapshot()
        status = snapshot.as_dict()
        status["groups"] = group_queues(self.snapshot, snapshot, self.pool)  # R-QUEUE-4
        status["gate"] = self.gate.by_provider()  # Stream Evidence Gate counts (R-SEG-6)
        status["ttft"] = self.meter.latency.window.percentiles()  # R-OBS-3: last minutes
        status["revision"] = self.revision  # which revision this Edge runs (R-SCALE-3)
        if self.managed_keys is not None:  # which route table requests use (R-MGD-12)
            status["credential_table"] = self.managed_keys.table.status()
        return status

    def credentials_changed(self) -> None:
        """Routes or slots were saved in this process (the admin, a command run in process):
        rebuild the route table now (synchronous; called after the commit, off the loop)."""
        if self.managed_keys is not None:
            from catalog.route_reader import refresh_route_table  # the ORM: after setup

            refresh_route_table(self.managed_keys)

    def relay_status(self) -> dict[str, int]:
        """Run output received from Nodes and not yet taken by clients (R-IN-5)."""
        total, largest, held = self.hub.relay_buffered()
        return {
            "relay_buffered_bytes": total,
            "relay_buffered_bytes_max": largest,
            "relay_held_streams": held,
        }

    async def apply(self, snapshot: EdgeSnapshot, *, revision: int | None = None) -> ApplyOutcome:
        """Install an already validated and classified snapshot (of the active ``revision``);
        applies are serialized."""
        async with self._lock():
            return await self._install(snapshot, revision)

    async def follow(
        self, snapshot: EdgeSnapshot, *, revision: int, seen: int | None
    ) -> ApplyOutcome | None:
        """Install ``revision``, activated by another Edge, unless this Edge's revision is no
        longer ``seen`` (a local apply ran since it was read): then None (R-SCALE-3)."""
        async with self._lock():
            if self.revision != seen:
                return None
            return await self._install(snapshot, revision)

    def _lock(self) -> asyncio.Lock:
        if self._apply_lock is None:
            self._apply_lock = asyncio.Lock()
        return self._apply_lock

    async def _install(self, snapshot: EdgeSnapshot, revision: int | None) -> ApplyOutcome:
        # Listen addresses are per Edge (iop_site.edge_local) and restart-required: an applied
        # document never moves a listener, so the running ones stay in the snapshot.
        current = self._snapshot
        snapshot = replace(
            snapshot,
            edge_listen=current.edge_listen,
            admin_listen=current.admin_listen,
            openai_listen=current.openai_listen,
        )
        # All or nothing: if the policy or the pool refuses it, the old snapshot stays.
        self.pool.apply(policy_from_snapshot(snapshot, version=revision or 0))
        self._snapshot = snapshot
        self.revision = revision
        pushed = await self.hub.push_refresh()
        return ApplyOutcome(pushed_nodes=tuple(pushed))

    async def aclose(self) -> None:
        self.health.close()
        self.loop_lag.stop()
        await self.hub.aclose()
        await self.meter.aclose()
        await self._close_companions()  # the pool engine last: it hands back what the hub freed
