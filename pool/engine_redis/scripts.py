"""The pool's Lua scripts: the shared prelude (``lua/lib*.lua``) + one body per operation,
loaded once per client with ``register_script`` (EVALSHA, reloaded by redis-py after a
restart)."""

from __future__ import annotations

from pathlib import Path

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

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
)
PRELUDE = ("lib.lua", "lib_queue.lua", "lib_health.lua")
_DIR = Path(__file__).resolve().parent / "lua"


def source(name: str) -> str:
    """The full text of one script: the prelude, then its body."""
    parts = (*PRELUDE, f"{name}.lua")
    return "\n".join((_DIR / part).read_text() for part in parts)


def register(client: Redis) -> dict[str, AsyncScript]:
    return {name: client.register_script(source(name)) for name in NAMES}
