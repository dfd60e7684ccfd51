"""The writer's own Redis connection (pool/engine_redis/background.py, ``write``): a batch's
scripts written at once as plain EVALSHA and their answers read in order, the whole round
trip bounded; the scripts loaded again when Redis forgot them; on every new connection the
``server`` script first, so a server that is not the one the store's epoch was born on (a
promoted replica, a restart) starts a new epoch before any other script runs there
(R-HA-2; docs/pool.md, "Redis engine")."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio.connection import AbstractConnection

from . import scripts
from .connect import Store

Command = tuple[str, list[str]]  # script name, its ARGV


class Link:
    """One connection, used by one task at a time (the writer; ``start`` before it)."""

    def __init__(self, store: Store, timeout_s: float, hello: Callable[[], Command]) -> None:
        # No per-read timer on this client: each round trip is bounded whole.
        self._client = store.client(decode_responses=True, socket_connect_timeout=1.0)
        self._timeout_s = timeout_s
        self._hello = hello  # the first script on each new connection (``server``)
        self.hello_answer: Any = None  # its last answer
        self._greeted = False  # ``hello`` ran on the current connection
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
        sent again, in order. On a new connection ``hello`` runs first (its answer is kept
        in ``hello_answer``)."""
        conn = self._conn
        assert conn is not None, "open() first"
        fresh = not conn.is_connected or not self._greeted
        if fresh:
            commands = [self._hello(), *commands]
        raws = await self._evalsha(commands)
        missing = [i for i, r in enumerate(raws) if isinstance(r, redis_errors.NoScriptError)]
        if missing:
            await scripts.load(self._client)
            again = await self._evalsha([commands[i] for i in missing])
            for i, raw in zip(missing, again, strict=True):
                raws[i] = raw
        if fresh:
            self.hello_answer = raws.pop(0)
            self._greeted = True
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
            if not conn.is_connected:  # through Sentinel: asks for the current primary first
                await conn.connect()
            await conn.send_packed_command(packed, check_health=False)
            raws: list[Any] = []
            for _ in commands:
                try:
                    raws.append(await conn.read_response())
                except redis_errors.ReadOnlyError:
                    # A replica (the primary was demoted): a lost store, as for a broken link;
                    # the next round trip connects again (through Sentinel, to the new primary).
                    await conn.disconnect()
                    raise redis_errors.ConnectionError("the store's server is a replica") from None
                except redis_errors.ResponseError as exc:
                    raws.append(exc)
        return raws
