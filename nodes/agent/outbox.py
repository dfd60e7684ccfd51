"""Per-run output: the first chunk goes out at once; chunks that arrive while a send is
in progress are coalesced into the next run_event (docs/performance.md: fewer, fuller frames).

A non-stream run (``hold``) keeps its output until the run ends, up to
``wire.MAX_EVENT_DATA_CHARS``, and it travels in the run's ``run_end``: its adapter emits
the whole answer at once just before it returns, so nothing waits and one frame is saved.

With flow control (``credit`` > 0, R-IN-5) a run sends at most its credit in characters
and waits for the Edge's ``credit`` messages for more; meanwhile ``emit`` blocks once
``MAX_BUFFERED_CHARS`` are queued, so the adapter stops reading its upstream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from nodes import wire

log = logging.getLogger("iop_node.outbox")

SendMessage = Callable[[wire.NodeToEdge], Awaitable[None]]
MAX_BUFFERED_CHARS = 4 * wire.MAX_EVENT_DATA_CHARS  # above this, emit waits (backpressure)


class RunOutput:
    """Buffers one run's output and sends it as run_event frames, in order."""

    def __init__(
        self, run_id: str, send: SendMessage, credit: int = 0, *, hold: bool = False
    ) -> None:
        self.run_id = run_id
        self._send = send
        self._hold = hold
        self._parts: list[str] = []
        self._size = 0
        self._flusher: asyncio.Task[None] | None = None
        self._room = asyncio.Event()
        self._room.set()
        self._credit: int | None = credit if credit > 0 else None
        self._credited = asyncio.Event()
        self.broken = False  # the connection failed or the run was dropped: output is dropped
        self.frames = 0
        self.emitted = False  # any output was handed over: a failure is after the first byte

    async def emit(self, text: str) -> None:
        """Queue output; start a flush unless one is running. Never delays the first chunk."""
        if not text or self.broken:
            return
        self.emitted = True
        self._parts.append(text)
        self._size += len(text)
        if not self._hold or self._size > wire.MAX_EVENT_DATA_CHARS:
            self._start_flush()
        if self._size > MAX_BUFFERED_CHARS:
            self._room.clear()
            await self._room.wait()

    def grant(self, chars: int) -> None:
        """The Edge relayed ``chars`` more characters: that much more may be sent."""
        if self._credit is not None and chars > 0:
            self._credit += chars
            self._credited.set()

    def _start_flush(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name=f"flush-{self.run_id}")

    async def _flush(self) -> None:
        try:
            while self._parts and not self.broken:
                data = "".join(self._parts)
                self._parts.clear()
                self._size = 0
                self._room.set()
                await self._send_data(data)
        except Exception as exc:  # connection gone: the client loop cancels the run
            log.debug("run %s: output dropped (%s)", self.run_id, type(exc).__name__)
            self.discard()

    async def _send_data(self, data: str) -> None:
        start = 0
        while start < len(data):
            size = wire.MAX_EVENT_DATA_CHARS
            if self._credit is not None:
                while self._credit <= 0 and not self.broken:
                    self._credited.clear()
                    await self._credited.wait()
                if self.broken:
                    return
                size = min(size, self._credit)
                self._credit -= min(size, len(data) - start)
            piece = data[start : start + size]
            await self._send(wire.RunEvent(run_id=self.run_id, data=piece))
            self.frames += 1
            start += size

    def discard(self) -> None:
        """Drop everything queued and stop sending (the run is over for the Edge)."""
        self.broken = True
        self._parts.clear()
        self._size = 0
        self._room.set()
        self._credited.set()

    async def drain(self, *, discard: bool = False) -> None:
        """Wait until everything queued is sent (or dropped, with ``discard``)."""
        if discard:
            self.discard()
        elif self._parts:
            self._start_flush()  # held output of a run that did not end well
        if self._flusher is not None:
            await self._flusher

    async def last(self) -> str:
        """The run ended well: wait for what is being sent, and return the output still
        held, to go in its ``run_end`` (sent as events instead when its credit is short)."""
        if self._flusher is not None:
            await self._flusher
        data = "".join(self._parts)
        if not data or self.broken:
            return ""
        if self._credit is not None:
            if len(data) > self._credit:
                await self.drain()
                return ""
            self._credit -= len(data)
        self._parts.clear()
        self._size = 0
        return data
