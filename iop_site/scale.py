"""Scale-out (R-SCALE-2, docs/scale-out.md): several Edges on one PostgreSQL and one Redis.

The one place where the Edge process is composed for scale-out: the settings, the checks that
refuse a start, the pool engine the runtime gets (the in-memory ``ProviderPool`` unless
``IOP_REDIS_URL`` is set: R-SCALE-1), the run router and the revision watcher, started and
stopped with the runtime. Without ``IOP_REDIS_URL`` nothing here changes the Edge.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from iop_site.env import env_float

if TYPE_CHECKING:
    from catalog.config import EdgeSnapshot
    from iop_site.runtime import EdgeRuntime
    from nodes.remote import RunRouter
    from pool.engine import PoolEngine, PoolPolicy


PREFIX_PATTERN = r"[A-Za-z0-9_.:-]{1,64}"


class ScaleOutRefused(RuntimeError):
    """This Edge cannot start in scale-out mode; ``str`` says why and what to change."""


@dataclass(frozen=True, slots=True)
class ScaleSettings:
    """``IOP_REDIS_URL``, ``IOP_REDIS_PREFIX``, ``IOP_LEASE_TTL_S``, ``IOP_REVISION_POLL_S``
    (defaults in docs/configuration.md)."""

    redis_url: str | None = None
    prefix: str = "iop"
    lease_ttl_s: float = 10.0
    revision_poll_s: float = 1.0

    @property
    def enabled(self) -> bool:
        return self.redis_url is not None

    @classmethod
    def from_env(cls) -> ScaleSettings:
        url = os.environ.get("IOP_REDIS_URL", "").strip() or None
        if url is not None:
            parts = urlsplit(url)
            if parts.scheme not in ("redis", "rediss") or not parts.hostname:
                # Never echo the URL: it may carry a password.
                raise ImproperlyConfigured(
                    "IOP_REDIS_URL: must be redis://HOST:PORT/DB (or rediss:// for TLS)"
                )
        prefix = os.environ.get("IOP_REDIS_PREFIX", "").strip() or "iop"
        if not re.fullmatch(PREFIX_PATTERN, prefix):
            raise ImproperlyConfigured(
                f"IOP_REDIS_PREFIX: must be 1 to 64 letters, digits, '_', '.', ':' or '-', "
                f"got {prefix!r}"
            )
        return cls(
            redis_url=url,
            prefix=prefix,
            lease_ttl_s=env_float("IOP_LEASE_TTL_S", 10.0, minimum=0.5),
            revision_poll_s=env_float("IOP_REVISION_POLL_S", 1.0, minimum=0.05),
        )


def refusal(
    scale: ScaleSettings, database_engine: str, snapshot: EdgeSnapshot | None = None
) -> str | None:
    """Why this Edge may not start in scale-out mode, or None (docs/scale-out.md); without a
    snapshot only the settings are checked."""
    if not scale.enabled:
        return None
    if not database_engine.endswith("postgresql"):
        return (
            "scale-out (IOP_REDIS_URL is set) needs every Edge on one PostgreSQL database: "
            "set DATABASE_URL=postgresql://... (this Edge would use its own SQLite file)"
        )
    return None


def alive_key(scale: ScaleSettings, edge_id: str) -> str:
    """The key a live Edge holds in Redis (docs/scale-out.md, ``{P}:alive:{edge_id}``)."""
    return f"{scale.prefix}:alive:{edge_id}"


def check_edge_id_free(scale: ScaleSettings, edge_id: str) -> None:
    """Refuse the start before anything listens when a live Edge already holds this id
    (its alive key exists); the engine's own claim at start is the final word."""
    import redis

    assert scale.redis_url is not None
    client = redis.Redis.from_url(scale.redis_url, socket_timeout=5, socket_connect_timeout=5)
    try:
        taken = client.exists(alive_key(scale, edge_id))
    except redis.RedisError as exc:
        why = type(exc).__name__
        if "CERTIFICATE_VERIFY_FAILED" in str(exc):  # rediss:// (docs/scale-out.md)
            why = (
                "TLS: certificate verify failed; name the CA that signed the server's "
                "certificate with ?ssl_ca_certs=FILE in IOP_REDIS_URL"
            )
        raise ScaleOutRefused(
            f"scale-out: Redis at IOP_REDIS_URL does not answer ({why})"
        ) from None
    finally:
        client.close()
    if taken:
        raise ScaleOutRefused(
            f"another Edge with id {edge_id!r} is alive (Redis key {alive_key(scale, edge_id)}): "
            "give this Edge its own IOP_EDGE_ID / --edge-id, or stop the other one"
        )


def build_pool(
    policy: PoolPolicy, *, scale: ScaleSettings, edge_id: str, clock: Callable[[], float]
) -> PoolEngine:
    """The pool engine: in memory without ``IOP_REDIS_URL`` (R-SCALE-1), else the Redis
    engine shared by every Edge (R-SCALE-2)."""
    if not scale.enabled:
        from pool.engine import ProviderPool

        return ProviderPool(policy, clock=clock)
    from pool.engine_redis import RedisPool

    assert scale.redis_url is not None
    return RedisPool(
        policy,
        redis_url=scale.redis_url,
        prefix=scale.prefix,
        edge_id=edge_id,
        lease_ttl_s=scale.lease_ttl_s,
        clock=clock,
    )


def companions(runtime: EdgeRuntime, *, scale: ScaleSettings, edge_id: str) -> list[Any]:
    """What scale-out starts with the runtime (each has ``async start()`` / ``aclose()``), in
    start order, closed in reverse: the pool engine, the per-token limits (set as
    ``runtime.shared_limits``), the run router (set as ``hub.remote``), the revision watcher."""
    if not scale.enabled:
        return []
    from django.conf import settings

    from iop_site.revisions import RevisionWatcher
    from pool.http.limits_shared import SharedTokenLimiter

    assert scale.redis_url is not None
    parts: list[Any] = [runtime.pool]
    runtime.shared_limits = SharedTokenLimiter(  # R-SCALE-6: one count across every Edge
        scale.redis_url,
        prefix=scale.prefix,
        window_s=settings.IOP_RATE_LIMIT_WINDOW_S,
        ttl_s=scale.lease_ttl_s,
    )
    parts.append(runtime.shared_limits)
    router = run_router(runtime, scale=scale, edge_id=edge_id)
    runtime.hub.remote = router  # run routing between Edges (docs/scale-out.md)
    parts.append(router)
    parts.append(RevisionWatcher(runtime, poll_s=scale.revision_poll_s))
    return parts


def run_router(runtime: EdgeRuntime, *, scale: ScaleSettings, edge_id: str) -> RunRouter:
    """Cross-Edge run routing (docs/scale-out.md, "Run routing"): the router that reaches a
    Node connected to another Edge."""
    from nodes.remote import RunRouter

    assert scale.redis_url is not None
    return RunRouter(
        scale.redis_url,
        prefix=scale.prefix,
        edge_id=edge_id,
        local=runtime.hub,  # the owner side runs orders on this Edge's own sessions
        ttl_s=scale.lease_ttl_s,
    )
