"""The writer's own Redis connection (pool/engine_redis/background.py, ``write``): a batch's
scripts written at once as plain EVALSHA and their answers read in order, the whole round
trip bounded; the scripts loaded again when Redis forgot them (docs/pool.md, "Redis
engine")."""

from __future__ import annotations

import asyncio
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection

from . import scripts

Command = tuple[str, list[str]]  # script name, its ARGV


class Link:
    """One connection, used by one task at a time (the writer; ``start`` before it)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        # No per-read timer on this client: each round trip is bounded whole.
        self._client = Redis.from_url(url, decode_responses=True, socket_connect_timeout=1.0)
        self._timeout_s = timeout_s
        self._conn: AbstractConnection | None = None  # taken from the pool once, kept

    async def open(self) -> None:
        """Connect and load every script (``SCRIPT LOAD``)."""
        self._conn = await self._client.connection_pool.get_connection()
        await scripts.load(self._client)

    async def aclose(self) -> None:
        await self._client.aclose()  # its connection too, though taken from the pool
        self._conn = None

    async def run(self, commands: list[Command]) -> list[Any]:
        """Each script's answer, in order (a script's error is its answer). Scripts Redis
        forgot (NOSCRIPT: refused whole, nothing of them ran) are loaded and those commands
        sent again, in order."""
        raws = await self._evalsha(commands)
        missing = [i for i, r in enumerate(raws) if isinstance(r, redis_errors.NoScriptError)]
        if missing:
            await scripts.load(self._client)
            again = await self._evalsha([commands[i] for i in missing])
            for i, raw in zip(missing, again, strict=True):
                raws[i] = raw
        return raws

    async def _evalsha(self, commands: list[Command]) -> list[Any]:
        """One plain EVALSHA per command (no SCRIPT EXISTS first, no pool checkout), all
        written at once; the whole round trip within the timeout. A connection error or
        timeout drops the connection (the next round trip connects again) and is raised."""
        conn = self._conn
        assert conn is not None, "open() first"
        packed = conn.pack_commands(
            ["EVALSHA", scripts.SHA[name], "0", *argv] for name, argv in commands
        )
        async with asyncio.timeout(self._timeout_s):
            await conn.send_packed_command(packed, check_health=False)
            raws: list[Any] = []
            for _ in commands:
                try:
                    raws.append(await conn.read_response())
                except redis_errors.ResponseError as exc:
                    raws.append(exc)
        return raws
