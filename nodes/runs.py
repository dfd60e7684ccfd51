"""A run's output channel from a Node to the request that owns it (Django-free)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from nodes import wire


@dataclass(frozen=True, slots=True)
class RunOrder:
    """What the HTTP surface asks a Node to run."""

    tunnel: bool  # True: TunnelRequest (passthrough); False: RunRequest (normalized), R-POOL-10
    operation: str
    stream: bool
    body: bytes
    forward_headers: tuple[tuple[str, str], ...] = ()


class RunChannel:
    """Output of one run, in order, ending with exactly one terminal ``RunEnd``.

    ``finish`` is idempotent: the first terminal wins, a duplicated or late one is
    ignored, so a run can never end twice (R-POOL-9).
    """

    __slots__ = ("_queue", "end", "node_id", "run_id")

    def __init__(self, run_id: str, node_id: str) -> None:
        self.run_id = run_id
        self.node_id = node_id
        self.end: wire.RunEnd | None = None
        self._queue: asyncio.Queue[str | wire.RunEnd] = asyncio.Queue()

    @property
    def finished(self) -> bool:
        return self.end is not None

    def feed(self, data: str) -> None:
        if self.end is None:
            self._queue.put_nowait(data)

    def finish(self, end: wire.RunEnd) -> bool:
        if self.end is not None:
            return False
        self.end = end
        self._queue.put_nowait(end)
        return True

    def fail(self, code: str, message: str) -> bool:
        return self.finish(
            wire.RunEnd(
                run_id=self.run_id, ok=False, error=wire.RunError(code=code, message=message)
            )
        )

    async def get(self) -> str | wire.RunEnd:
        return await self._queue.get()

    def get_nowait(self) -> str | wire.RunEnd | None:
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            return None
