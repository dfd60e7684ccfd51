"""A hand-driven clock: time moves only when a test says so."""

from __future__ import annotations


class Clock:
    """Call it for the time; set or add to ``now`` to move it."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
