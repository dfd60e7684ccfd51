"""One call of a ``RedisPool`` for its one ordered writer (pool/engine_redis/background.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pool.engine.model import Lease


@dataclass(slots=True)
class Job:
    """One call for the writer; ``script`` "" is a barrier (nothing to run)."""

    script: str
    args: list[str]
    done: Callable[[Any], None] | None = None
    acquire: asyncio.Future[Lease] | None = None  # an admission fails at once on an outage
