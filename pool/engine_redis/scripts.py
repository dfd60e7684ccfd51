"""The pool's Lua scripts: the shared prelude (``lua/lib*.lua``) + one body per operation,
called by SHA1 with plain EVALSHA. ``load`` sends them once at start (SCRIPT LOAD), and
again when Redis answers NOSCRIPT (it restarted empty or its script cache was flushed);
see docs/pool.md, "Redis engine"."""

from __future__ import annotations

import hashlib
from pathlib import Path

from redis.asyncio import Redis

NAMES = (
    "admit",
    "release",
    "cancel",
    "renew",
    "sweep",
    "expire",
    "node",
    "health",
    "apply",
    "snapshot",
    "start",
    "server",
)
PRELUDE = ("lib.lua", "lib_queue.lua", "lib_health.lua")
_DIR = Path(__file__).resolve().parent / "lua"


def source(name: str) -> str:
    """The full text of one script: the prelude, then its body."""
    parts = (*PRELUDE, f"{name}.lua")
    return "\n".join((_DIR / part).read_text() for part in parts)


SOURCES = {name: source(name) for name in NAMES}
SHA = {name: hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()
       for name, text in SOURCES.items()}  # fmt: skip


async def load(client: Redis) -> None:
    """Put every script in Redis's script cache (one round trip)."""
    async with client.pipeline(transaction=False) as pipe:
        for text in SOURCES.values():
            pipe.script_load(text)
        await pipe.execute()
