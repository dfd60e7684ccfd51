"""Clients of the shared store named by ``IOP_REDIS_URL`` (R-SCALE-2, R-HA-1; docs/scale-out.md,
"Redis Sentinel"): a plain ``redis://`` / ``rediss://`` server, or a primary found through Redis
Sentinel, ``redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]`` (``rediss+sentinel://``
for TLS to the sentinels and the servers alike). A Sentinel client is redis-py's own
(``Sentinel.master_for``): each new connection asks the sentinels for the current primary, so
a connection broken by a failover reconnects to the promoted replica. Nothing secret in an
error: the URL may hold a password."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel

SCHEMES = ("redis", "rediss", "redis+sentinel", "rediss+sentinel")
TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs")
SENTINEL_OPTIONS = ("sentinel_password",)
SERVICE = re.compile(r"[A-Za-z0-9_.-]{1,128}")


class StoreUrlError(ValueError):
    """``IOP_REDIS_URL`` cannot name a store; ``str`` says why (never the URL itself)."""


@dataclass(frozen=True)
class Store:
    """What ``IOP_REDIS_URL`` names: its URL for a plain server, or the sentinels, service and
    database of a Sentinel-managed primary."""

    url: str
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    tls: bool = False
    options: dict[str, str] = field(default_factory=dict)  # TLS files, credentials

    @property
    def sentinel(self) -> bool:
        return bool(self.sentinels)

    def _server_kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"db": self.db}
        for name in ("username", "password"):
            if self.options.get(name):
                out[name] = self.options[name]
        if self.tls:
            out["ssl"] = True
            out.update({k: self.options[k] for k in TLS_OPTIONS if k in self.options})
        return out

    def _sentinel_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in kwargs.items() if k.startswith("socket_") or k == "retry"}
        if self.options.get("sentinel_password"):
            out["password"] = self.options["sentinel_password"]
        if self.tls:
            out["ssl"] = True
            out.update({k: self.options[k] for k in TLS_OPTIONS if k in self.options})
        return out

    def client(self, **kwargs: Any) -> Redis:
        """An asyncio client of the store's primary (its own connection pool)."""
        if not self.sentinel:
            return Redis.from_url(self.url, **kwargs)
        manager = Sentinel(list(self.sentinels), sentinel_kwargs=self._sentinel_kwargs(kwargs))
        client = manager.master_for(
            self.service, redis_class=FollowingRedis, **self._server_kwargs(), **kwargs
        )
        assert isinstance(client, FollowingRedis)
        client.manager = manager
        return client

    def sync_client(self, **kwargs: Any) -> redis.Redis:
        """A blocking client of the store's primary (start checks, scripts, tests)."""
        if not self.sentinel:
            return redis.Redis.from_url(self.url, **kwargs)
        manager = redis.sentinel.Sentinel(
            list(self.sentinels), sentinel_kwargs=self._sentinel_kwargs(kwargs)
        )
        return manager.master_for(self.service, **self._server_kwargs(), **kwargs)

    def sentinel_clients(self, **kwargs: Any) -> list[tuple[str, redis.Redis]]:
        """One blocking client per sentinel, named ``host:port`` (start checks)."""
        sk = self._sentinel_kwargs(kwargs)
        return [(f"{h}:{p}", redis.Redis(host=h, port=p, **sk)) for h, p in self.sentinels]


class FollowingRedis(Redis):
    """A Sentinel ``master_for`` client that also closes its sentinels' connections."""

    manager: Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        if self.manager is not None:
            await self.manager.aclose()
            self.manager = None


def parse(url: str) -> Store:
    """The store ``url`` names; ``StoreUrlError`` saying what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise StoreUrlError(
            "must be redis://HOST:PORT/DB, rediss://... for TLS, or "
            "redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE/DB for Redis Sentinel"
        )
    tls = parts.scheme.startswith("rediss")
    if "+sentinel" not in parts.scheme:
        if not parts.hostname:
            raise StoreUrlError("must be redis://HOST:PORT/DB (or rediss:// for TLS)")
        return Store(url=url, tls=tls)
    creds, _, hosts = parts.netloc.rpartition("@")
    sentinels = tuple(_address(h) for h in hosts.split(","))
    path = [p for p in parts.path.split("/") if p]
    if not path or not SERVICE.fullmatch(path[0]) or len(path) > 2:
        raise StoreUrlError(
            "a redis+sentinel:// URL names the service after the sentinels: "
            "redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE/DB"
        )
    if len(path) == 2 and not path[1].isdigit():
        raise StoreUrlError(f"the database after the service must be a number, got {path[1]!r}")
    options: dict[str, str] = {}
    known = (*TLS_OPTIONS, *SENTINEL_OPTIONS) if tls else SENTINEL_OPTIONS
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name not in known:
            raise StoreUrlError(f"unknown option {name!r} in the query (known: {', '.join(known)})")
        options[name] = value
    if creds:
        user, _, password = creds.partition(":")
        options["username"], options["password"] = unquote(user), unquote(password)
    return Store(
        url=url,
        sentinels=sentinels,
        service=path[0],
        db=int(path[1]) if len(path) == 2 else 0,
        tls=tls,
        options=options,
    )


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.strip().rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise StoreUrlError(
            f"every sentinel is HOST:PORT, got {text.strip()!r} (sentinels usually listen on 26379)"
        )
    return host.strip("[]"), int(port)
