"""Translate the runtime config snapshot into the pool engine's policy (no Django)."""

from __future__ import annotations

from typing import Any

from catalog.config import EdgeSnapshot
from pool.engine import HealthPolicy, PoolEngine, PoolPolicy, PoolProvider, PoolSnapshot
from pool.translate.plan import served_capabilities


def policy_from_snapshot(snapshot: EdgeSnapshot, *, version: int = 0) -> PoolPolicy:
    """The pool's policy for ``snapshot``; ``version`` is the active revision id."""
    providers = tuple(
        PoolProvider(
            node_id=spec.node_id,
            provider_id=spec.id,
            capacity=spec.capacity,
            long_capacity=spec.long_context_capacity,
            priority=spec.priority,
            enabled=spec.enabled,
            capabilities=served_capabilities(spec.profile.capabilities),  # R-XLATE-1
            fingerprint=spec.address,
        )
        for node in snapshot.nodes
        for spec in node.providers
    )
    groups = {model.id: tuple(model.providers) for model in snapshot.models.values()}
    return PoolPolicy(
        providers=providers,
        groups=groups,
        max_queue=snapshot.max_queue,
        queue_timeout_ms=snapshot.queue_timeout_ms,
        health=HealthPolicy(
            eject_after_failures=snapshot.eject_after_failures,
            eject_base_s=snapshot.eject_base_s,
            eject_max_s=snapshot.eject_max_s,
        ),
        version=version,
    )


def group_queues(
    snapshot: EdgeSnapshot, pool_snapshot: PoolSnapshot, pool: PoolEngine
) -> dict[str, dict[str, Any]]:
    """Each model group's queue for the status page (R-QUEUE-4): requests waiting that could
    run on its providers (the most on any one of them), the estimated wait of a new request
    (ms, None while unknown; R-QUEUE-3), and its affinity hits and misses (R-AFF-1)."""
    queued = {row.provider_id: row.queued for row in pool_snapshot.providers}
    hits, misses = pool.affinity_counts  # R-AFF-1
    out: dict[str, dict[str, Any]] = {}
    for group in snapshot.models.values():
        eta = pool.estimate_wait(group.id)
        out[group.id] = {
            "queued": max((queued.get(p, 0) for p in group.providers), default=0),
            "eta_ms": None if eta is None else round(eta * 1000),
            "affinity_hits": hits.get(group.id, 0),
            "affinity_misses": misses.get(group.id, 0),
        }
    return out
