"""The Edge's running state: the active snapshot, the pool and the Node hub (no Django).

One object, created at start and passed to the ASGI apps; apply swaps the snapshot
copy-on-write, keeps every lease and re-evaluates the queue (R-REF-3).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from catalog.config import EdgeSnapshot
from nodes.hub import NodeHub
from pool.engine import ProviderPool
from pool.metering import UsageMeter
from pool.policy import policy_from_snapshot


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    pushed_nodes: tuple[str, ...]


class EdgeRuntime:
    def __init__(
        self,
        snapshot: EdgeSnapshot,
        *,
        clock: Callable[[], float] = time.monotonic,
        heartbeat_interval_s: float = 15.0,
        heartbeat_timeout_s: float = 45.0,
    ) -> None:
        self._snapshot = snapshot
        self.started_at = time.time()
        self.pool = ProviderPool(policy_from_snapshot(snapshot), clock=clock)
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

    @property
    def snapshot(self) -> EdgeSnapshot:
        return self._snapshot

    async def apply(self, snapshot: EdgeSnapshot) -> ApplyOutcome:
        """Install an already validated and classified snapshot; applies are serialized."""
        if self._apply_lock is None:
            self._apply_lock = asyncio.Lock()
        async with self._apply_lock:
            self._snapshot = snapshot
            self.pool.apply(policy_from_snapshot(snapshot))
            pushed = await self.hub.push_refresh()
        return ApplyOutcome(pushed_nodes=tuple(pushed))

    async def aclose(self) -> None:
        await self.hub.aclose()
        await self.meter.aclose()
