"""Helpers for run routing between Edges (tests/test_run_routing.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from nodes import wire
from nodes.runs import RunChannel

WAIT_S = 5.0


class FrameLog:
    """A Node's websocket as the Edge sees it: every frame sent to it, decoded."""

    def __init__(self) -> None:
        self.sent: list[wire.EdgeToNode] = []
        self.closed: int | None = None

    async def send(self, frame: bytes) -> None:
        self.sent.append(wire.decode_from_edge(frame))

    async def close(self, code: int) -> None:
        self.closed = code

    def runs(self) -> list[wire.RunRequest | wire.TunnelRequest]:
        return [m for m in self.sent if isinstance(m, wire.RunRequest | wire.TunnelRequest)]

    def cancelled(self, run_id: str) -> bool:
        return any(isinstance(m, wire.Cancel) and m.run_id == run_id for m in self.sent)

    def credit(self, run_id: str) -> int:
        return sum(m.chars for m in self.sent if isinstance(m, wire.Credit) and m.run_id == run_id)


async def until(predicate: Callable[[], bool], what: str, within: float = WAIT_S) -> None:
    """Poll ``predicate`` while the loop (and Redis round trips) move on; bounded."""
    step_s = 0.005
    for _ in range(int(within / step_s)):
        if predicate():
            return
        await asyncio.sleep(step_s)
    raise AssertionError(f"not reached within about {within} s: {what}")


async def read_all(channel: RunChannel, release: bool = False) -> tuple[str, wire.RunEnd]:
    """A run's whole output and its end; ``release`` returns each piece as credit, as a
    client that reads would."""
    parts: list[str] = []
    async with asyncio.timeout(WAIT_S * 2):
        while True:
            item = await channel.get()
            if isinstance(item, wire.RunEnd):
                return "".join(parts), item
            parts.append(item)
            if release:
                channel.release()
