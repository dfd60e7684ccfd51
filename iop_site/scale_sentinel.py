"""The start check of an ``IOP_REDIS_URL`` naming Redis Sentinel (R-HA-1, R-SCALE-9;
docs/scale-out.md, "Redis Sentinel"): every sentinel listed is asked for the service's
primary; the Edge refuses to start, with one line, when none answers, none knows the
service, or those that answer name different primaries (a failover under way, or sentinels
of different deployments). Never the URL in a message: it may hold a password."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from iop_site.scale import ScaleSettings

SENTINEL_TIMEOUT_S = 2.0


def check_sentinels(scale: ScaleSettings) -> None:
    import redis

    from iop_site.scale import ScaleOutRefused, one_try
    from pool.engine_redis.connect import parse

    assert scale.redis_url is not None
    store = parse(scale.redis_url)
    if not store.sentinel:
        return
    answers: dict[str, str | None] = {}  # sentinel -> "host:port" of the primary, or None
    for name, client in store.sentinel_clients(
        socket_timeout=SENTINEL_TIMEOUT_S,
        socket_connect_timeout=SENTINEL_TIMEOUT_S,
        retry=one_try(),
    ):
        try:
            addr = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", store.service)
        except redis.RedisError:
            continue
        finally:
            client.close()
        answers[name] = None if not addr else f"{_text(addr[0])}:{_text(addr[1])}"
    tried = ", ".join(f"{h}:{p}" for h, p in store.sentinels)
    if not answers:
        raise ScaleOutRefused(
            f"no sentinel named in IOP_REDIS_URL answers (tried {tried}): start them, or "
            "check their hosts and ports"
        )
    known = {name: addr for name, addr in answers.items() if addr is not None}
    if not known:
        raise ScaleOutRefused(
            f"the sentinels at IOP_REDIS_URL ({', '.join(answers)}) do not know the service "
            f"{store.service!r}: check the name after the sentinels (their `sentinel monitor`)"
        )
    if len(set(known.values())) > 1:
        seen = ", ".join(f"{name} says {addr}" for name, addr in sorted(known.items()))
        raise ScaleOutRefused(
            f"the sentinels at IOP_REDIS_URL disagree on the primary of {store.service!r} "
            f"({seen}): wait for the failover to end, or list sentinels of one deployment"
        )


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
