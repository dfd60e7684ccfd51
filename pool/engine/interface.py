"""``PoolEngine``: what the Edge needs from a provider pool (docs/pool.md).

Two engines satisfy it: ``pool.engine.ProviderPool`` (in memory, one Edge, the reference) and
``pool.engine_redis.RedisPool`` (shared through Redis by several Edges, R-SCALE-2). Callers
(the runtime, the health timer, the Node hub, the HTTP surface) type against this Protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from .model import Lease, PoolPolicy, PoolSnapshot


class PoolEngine(Protocol):
    """Leases, one FIFO waiter queue, node readiness and provider health (R-POOL-1..9)."""

    on_health_change: Callable[[], None] | None

    async def start(self) -> None:
        """Connect what runs beside the requests; call once from the running loop."""
        ...

    async def aclose(self) -> None:
        """Stop background work; leases still held are the caller's to release first."""
        ...

    async def acquire(
        self,
        model: str,
        needs: frozenset[str] = frozenset(),
        *,
        long: bool = False,
        owner: str | None = None,
        max_queued: int | None = None,
        exclude: frozenset[str] = frozenset(),
        on_queued: Callable[[Callable[[], int | None]], None] | None = None,
    ) -> Lease:
        """Lease a provider of ``model`` able to serve ``needs``, waiting in the queue; when
        it queues, ``on_queued`` gets a function telling its position (1 = next; None when
        the engine cannot tell), for the queue events of R-QUEUE-4."""
        ...

    def release(self, lease: Lease) -> bool:
        """Give the lease back; True the first time, False after (R-POOL-9)."""
        ...

    @property
    def reachable(self) -> bool:
        """False while the engine's shared store cannot be reached (admissions then fail at
        once); the in-memory engine is always reachable."""
        ...

    def succeeded(self, lease: Lease) -> None:
        """The lease's upstream answered (R-HEALTH-2); call before ``release``."""
        ...

    def failed(self, lease: Lease, reason: str, retry_after_s: float | None = None) -> None:
        """The lease's run failed before its first byte (R-HEALTH-2); call before ``release``."""
        ...

    def probed(self, node_id: str, provider_id: str, ok: bool, reason: str = "") -> None:
        """An active probe's verdict from the provider's Node (R-HEALTH-3)."""
        ...

    def wake(self) -> int:
        """Let providers whose ejection is over take a trial request."""
        ...

    def next_wake(self) -> float | None:
        """When the earliest known ejection ends, on the caller's clock; None when none."""
        ...

    @property
    def ejections_total(self) -> dict[str, int]:
        """Ejections so far per provider id (never decreases)."""
        ...

    def node_ready(
        self, node_id: str, generation: int, refused: Mapping[str, str] | None = None
    ) -> None:
        """The node's connection generation acked its config (R-NODE-1, R-TLS-3)."""
        ...

    def node_refused(self, node_id: str, generation: int, refused: Mapping[str, str]) -> None:
        """The ready Node now refuses exactly ``refused``."""
        ...

    def node_gone(self, node_id: str, generation: int) -> None:
        """The node's connection generation ended."""
        ...

    def apply(self, policy: PoolPolicy) -> None:
        """Install a new policy, keeping leases (R-REF-3)."""
        ...

    def expire(self) -> int:
        """Time out overdue waiters now."""
        ...

    def snapshot(self) -> PoolSnapshot:
        """Per-provider figures, queue depth and oldest wait (R-POOL-8)."""
        ...

    async def fresh_snapshot(self) -> PoolSnapshot:
        """The snapshot at most the engine's stated age old (R-SCALE-8): a read never answers
        an older view; ``PoolBackendUnavailable`` when it cannot be read in time."""
        ...

    def estimate_wait(
        self, model: str, needs: frozenset[str] = frozenset(), long: bool = False
    ) -> float | None:
        """Seconds a request of ``model`` arriving now would wait in the queue: 0 with a free
        slot; None when unknown (R-QUEUE-3, pool/engine/estimate.py)."""
        ...

    def drain_s(self) -> float | None:
        """Seconds until the queue has drained at the measured rates; None when unknown
        (R-QUEUE-1: ``Retry-After`` of a capacity refusal)."""
        ...

    def idle(self) -> bool:
        """No lease and no waiter of this Edge."""
        ...

    def queued_by(self, owner: str) -> int:
        """Waiters ``owner`` holds in the queue now (R-PRIN-3)."""
        ...
