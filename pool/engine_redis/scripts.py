"""The pool's Lua scripts: ``lua/lib.lua`` (shared prelude) + one body per operation, loaded
once per client with ``register_script`` (EVALSHA, reloaded by redis-py after a restart)."""

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
_DIR = Path(__file__).resolve().parent / "lua"


def source(name: str) -> str:
    """The full text of one script: the prelude, then its body."""
    return (_DIR / "lib.lua").read_text() + "\n" + (_DIR / f"{name}.lua").read_text()


def register(client: Redis) -> dict[str, AsyncScript]:
    return {name: client.register_script(source(name)) for name in NAMES}
