"""Scale-out (R-SCALE-2, docs/scale-out.md): several Edges on one PostgreSQL and one Redis.

The one place where the Edge process is composed for scale-out: the settings, the checks that
refuse a start, the pool engine the runtime gets (the in-memory ``ProviderPool`` unless
``IOP_REDIS_URL`` is set: R-SCALE-1), the run router and the revision watcher, started and
stopped with the runtime. Without ``IOP_REDIS_URL`` nothing here changes the Edge.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from iop_site.env import env_float

if TYPE_CHECKING:
    from redis.retry import Retry

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
            from pool.engine_redis.connect import StoreUrlError, parse

            try:
                parse(url)
            except StoreUrlError as exc:  # never the URL itself: it may carry a password
                raise ImproperlyConfigured(f"IOP_REDIS_URL: {exc}") from None
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


MIN_REDIS = (7, 0)  # the oldest Redis the engine's scripts and streams are run on
REDIS_CHECK_TIMEOUT_S = 5.0


def one_try() -> Retry:
    """A start check's ``retry``: one attempt, so a refusal comes within its stated bound.
    redis-py's default retries a failed connection three times with a backoff of up to 10 s,
    which made a refused connection take about 5 s and a silent port four times its bound."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return Retry(NoBackoff(), 0)


def check_redis(scale: ScaleSettings) -> None:
    """Refuse the start before anything is written or listens (R-SCALE-9) when the Redis at
    IOP_REDIS_URL does not answer, is not a Redis, or is older than ``MIN_REDIS``; with
    Sentinel (R-HA-1), first when no sentinel answers, none knows the service, or those that
    answer name different primaries."""
    from iop_site.scale_sentinel import check_sentinels

    check_sentinels(scale)
    version = str(_ask_redis(scale, lambda client: client.info("server")).get("redis_version"))
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
    if len(parts) < 2 or parts < MIN_REDIS:
        raise ScaleOutRefused(
            f"the Redis at IOP_REDIS_URL is version {version}; scale-out needs Redis "
            f"{MIN_REDIS[0]}.{MIN_REDIS[1]} or newer: upgrade it, or point IOP_REDIS_URL at "
            "another"
        )


def check_edge_id_free(scale: ScaleSettings, edge_id: str) -> None:
    """Refuse the start before anything listens when a live Edge already holds this id
    (its alive key exists); the engine's own claim at start is the final word."""
    taken = _ask_redis(scale, lambda client: client.exists(alive_key(scale, edge_id)))
    if taken:
        raise ScaleOutRefused(
            f"another Edge with id {edge_id!r} is alive (Redis key {alive_key(scale, edge_id)}): "
            "give this Edge its own IOP_EDGE_ID / --edge-id, or stop the other one"
        )


def _ask_redis(scale: ScaleSettings, ask: Callable[[Any], Any]) -> Any:
    """One question to the Redis at IOP_REDIS_URL; ``ScaleOutRefused`` saying what is wrong."""
    import redis

    from pool.engine_redis.connect import parse

    assert scale.redis_url is not None
    client = parse(scale.redis_url).sync_client(
        socket_timeout=REDIS_CHECK_TIMEOUT_S,
        socket_connect_timeout=REDIS_CHECK_TIMEOUT_S,
        retry=one_try(),
        decode_responses=True,
    )
    try:
        return ask(client)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise ScaleOutRefused(_unreachable(exc)) from None
    except redis.ResponseError as exc:
        if "unknown command" not in str(exc).lower():
            raise ScaleOutRefused(f"the Redis at IOP_REDIS_URL refused a check: {exc}") from None
        raise ScaleOutRefused(  # HELLO is Redis 6's
            f"the Redis at IOP_REDIS_URL is older than 6.0; scale-out needs Redis "
            f"{MIN_REDIS[0]}.{MIN_REDIS[1]} or newer: upgrade it, or point IOP_REDIS_URL at another"
        ) from None
    except redis.RedisError as exc:
        raise ScaleOutRefused(
            f"IOP_REDIS_URL does not point at a Redis server ({type(exc).__name__}): check its "
            "host and port"
        ) from None
    finally:
        client.close()


def _unreachable(exc: BaseException) -> str:
    """The refusal for a Redis that cannot be used; never the URL (it may hold a password)."""
    text = str(exc).lower()
    if "certificate_verify_failed" in text:  # rediss:// (docs/scale-out.md)
        return (
            "Redis at IOP_REDIS_URL does not answer (TLS: certificate verify failed; name the "
            "CA that signed the server's certificate with ?ssl_ca_certs=FILE in IOP_REDIS_URL)"
        )
    if "refused" in text or "111" in text or "name or service" in text:
        return (
            "Redis at IOP_REDIS_URL does not answer (connection refused): start it, or check "
            "IOP_REDIS_URL's host and port"
        )
    if isinstance(exc, TimeoutError) or "timeout" in text or "timed out" in text:
        return (
            f"Redis at IOP_REDIS_URL did not answer within {REDIS_CHECK_TIMEOUT_S:.0f} s: is "
            "that address a Redis server?"
        )
    return (
        f"IOP_REDIS_URL does not point at a Redis server (the connection failed: "
        f"{type(exc).__name__}): check its host and port"
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
    from pool.engine_redis import RedisPool
    from pool.http.limits_shared import SharedTokenLimiter

    assert scale.redis_url is not None
    pool = runtime.pool
    assert isinstance(pool, RedisPool)
    pool.on_fenced = exit_fenced  # R-SCALE-4
    parts: list[Any] = [pool]
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
    pool = runtime.pool
    return RunRouter(
        scale.redis_url,
        prefix=scale.prefix,
        edge_id=edge_id,
        local=runtime.hub,  # the owner side runs orders on this Edge's own sessions
        ttl_s=scale.lease_ttl_s,
        fence=lambda: getattr(pool, "fence", None),  # claimed by the pool, started first
    )


def exit_fenced() -> None:
    """R-SCALE-4: another process took this Edge's id over (docs/scale-out.md, "Fencing").
    This process exits at once with status 1, as a crash would: nothing of it may serve any
    more, so its clients' connections break and its Nodes move to the next Edge; its leases
    expire in Redis and the Edges serving its routed runs cancel them."""
    sys.stderr.write(
        "IOP Edge stopped: its Edge id was taken over by a newer process (fenced); "
        "give each Edge process its own IOP_EDGE_ID\n"
    )
    sys.stderr.flush()
    os._exit(1)
