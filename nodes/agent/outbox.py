"""Per-run output: the first chunk goes out at once; chunks that arrive while a send is
in progress are coalesced into the next run_event (docs/performance.md: fewer, fuller frames)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from nodes import wire

log = logging.getLogger("iop_node.outbox")

SendMessage = Callable[[wire.NodeToEdge], Awaitable[None]]
MAX_BUFFERED_CHARS = 4 * wire.MAX_EVENT_DATA_CHARS  # above this, emit waits (backpressure)


def split(data: str, size: int = wire.MAX_EVENT_DATA_CHARS) -> list[str]:
    """Pieces of at most ``size`` characters, in order."""
    return [data[i : i + size] for i in range(0, len(data), size)] or [""]


class RunOutput:
    """Buffers one run's output and sends it as run_event frames, in order."""

    def __init__(self, run_id: str, send: SendMessage) -> None:
        self.run_id = run_id
        self._send = send
        self._parts: list[str] = []
        self._size = 0
        self._flusher: asyncio.Task[None] | None = None
        self._room = asyncio.Event()
        self._room.set()
        self.broken = False  # the connection failed; output is dropped from here on
        self.frames = 0
        self.emitted = False  # any output was handed over: a failure is after the first byte

    async def emit(self, text: str) -> None:
        """Queue output; start a flush unless one is running. Never delays the first chunk."""
        if not text or self.broken:
            return
        self.emitted = True
        self._parts.append(text)
        self._size += len(text)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name=f"flush-{self.run_id}")
        if self._size > MAX_BUFFERED_CHARS:
            self._room.clear()
            await self._room.wait()

    async def _flush(self) -> None:
        try:
            while self._parts:
                data = "".join(self._parts)
                self._parts.clear()
                self._size = 0
                self._room.set()
                for piece in split(data):
                    await self._send(wire.RunEvent(run_id=self.run_id, data=piece))
                    self.frames += 1
        except Exception as exc:  # connection gone: the client loop cancels the run
            log.debug("run %s: output dropped (%s)", self.run_id, type(exc).__name__)
            self.broken = True
            self._parts.clear()
            self._room.set()

    async def drain(self, *, discard: bool = False) -> None:
        """Wait until everything queued is sent (or dropped, with ``discard``)."""
        if discard:
            self._parts.clear()
            self._size = 0
            self._room.set()
        if self._flusher is not None:
            await self._flusher
