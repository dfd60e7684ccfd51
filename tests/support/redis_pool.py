"""Redis engine tests: a real Redis (``IOP_TEST_REDIS_URL``), a random key prefix per test
(its keys deleted after), several ``RedisPool`` "Edges" in one process, and a Redis server
of the test's own that it may kill."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import redis

from pool.engine import Lease, PoolPolicy, PoolProvider
from pool.engine_redis import RedisPool
from tests.support.pools import prov
from tests.support.processes import free_port

REDIS_URL = os.environ.get("IOP_TEST_REDIS_URL", "")
needs_redis = pytest.mark.skipif(
    not REDIS_URL, reason="IOP_TEST_REDIS_URL is not set: the Redis engine needs a real Redis"
)
WAIT_S = 10.0


def new_prefix() -> str:
    return f"iop-test-{secrets.token_hex(6)}"


def drop_keys(url: str, prefix: str) -> None:
    """Delete this prefix's keys only (never FLUSHDB: the Redis is shared)."""
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(f"{prefix}:*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def settled_epoch(url: str, prefix: str) -> None:
    """An epoch born long ago: the Redis is not recovering from a loss of data."""
    client = redis.Redis.from_url(url)
    try:
        client.hset(f"{prefix}:epoch", mapping={"id": "settled", "born_ms": 0})
    finally:
        client.close()


def policy(
    *providers: PoolProvider,
    groups: dict[str, tuple[str, ...]] | None = None,
    max_queue: int = 16,
    timeout_ms: int = 0,
    version: int = 0,
) -> PoolPolicy:
    groups = groups or {"m": tuple(p.provider_id for p in providers)}
    return PoolPolicy(
        providers, groups, max_queue=max_queue, queue_timeout_ms=timeout_ms, version=version
    )


class Edges:
    """Started ``RedisPool``s on one prefix; ``edge(i)`` is the i-th, closed at the end."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self.pools: list[RedisPool] = []

    async def start(
        self,
        pool_policy: PoolPolicy,
        edge_id: str,
        *,
        ttl: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> RedisPool:
        pool = RedisPool(
            pool_policy,
            redis_url=self.url,
            prefix=self.prefix,
            edge_id=edge_id,
            lease_ttl_s=ttl,
            clock=clock,
        )
        await pool.start()
        self.pools.append(pool)
        return pool

    async def close(self) -> None:
        for pool in self.pools:
            with contextlib.suppress(Exception):
                await pool.aclose()

    async def one_slot_held(self) -> tuple[RedisPool, RedisPool, Lease]:
        """edge-a and edge-b on one provider of capacity 1 (Node n1 ready on edge-a),
        edge-a holding its slot."""
        pol = policy(prov("p1", cap=1))
        a = await self.start(pol, "edge-a")
        b = await self.start(pol, "edge-b")
        a.node_ready("n1", 1)
        return a, b, await a.acquire("m")


@contextlib.asynccontextmanager
async def edges(url: str = "", *, settled: bool = True) -> AsyncIterator[Edges]:
    url = url or REDIS_URL
    prefix = new_prefix()
    if settled:
        settled_epoch(url, prefix)
    group = Edges(url, prefix)
    try:
        yield group
    finally:
        await group.close()
        with contextlib.suppress(redis.ConnectionError):
            drop_keys(url, prefix)


async def until(predicate: Callable[[], bool], what: str = "condition") -> None:
    """Poll ``predicate`` while the loop runs (Redis answers arrive on their own); bounded."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{what}: not reached in {WAIT_S:.0f} s")


class OwnRedis:
    """A redis-server of the test's own on a free port, no persistence; ``kill``/``start``.
    With ``tls`` (certificate, key and CA files) it listens for TLS only and ``url`` is the
    ``rediss://`` URL an Edge is given (docs/scale-out.md, "Redis over TLS")."""

    def __init__(self, directory: Path, tls: tuple[Path, Path, Path] | None = None) -> None:
        self.port = free_port()
        self.tls = tls
        if tls is None:
            self.url = f"redis://127.0.0.1:{self.port}/0"
        else:
            self.url = f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={tls[2]}"
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        base = ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--dir", str(self.directory)]  # fmt: skip
        if self.tls is None:
            return [*base, "--port", str(self.port)]
        cert, key, ca = self.tls
        return [*base, "--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(cert),
                "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca),
                "--tls-auth-clients", "no"]  # fmt: skip

    def start(self) -> None:
        log = self.directory / f"redis-{self.port}.log"
        with log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None:  # it refused its arguments (a build without TLS)
                    raise RedisStartError(log.read_text(errors="replace")[-2000:]) from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)  # waiting for a child process to listen, not for pool state
        client.close()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=WAIT_S)
            self.proc = None


class RedisStartError(RuntimeError):
    """The test's own redis-server exited at start; the message is its output."""


@contextlib.contextmanager
def own_redis(directory: Path, tls: tuple[Path, Path, Path] | None = None) -> Iterator[OwnRedis]:
    server = OwnRedis(directory, tls)
    server.start()
    try:
        yield server
    finally:
        server.kill()


async def crash(pool: RedisPool) -> None:
    """The Edge process dies: nothing more reaches Redis (no release, no renewal)."""
    from pool.engine_redis import background

    await background.stop_ticker(pool)
    await background.stop_tasks(pool)
    pool._jobs.clear()
    await pool._disconnect()  # aclose() has nothing left to do


async def queued(pool: RedisPool, depth: int) -> None:
    """Return once the global queue holds ``depth`` waiters."""
    for _ in range(1000):
        if (await pool.fetch_snapshot()).queue_depth == depth:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"the queue never held {depth} waiters")
