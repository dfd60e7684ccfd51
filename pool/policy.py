"""Translate the runtime config snapshot into the pool engine's policy (no Django)."""

from __future__ import annotations

from catalog.config import EdgeSnapshot
from pool.engine import HealthPolicy, PoolPolicy, PoolProvider
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
