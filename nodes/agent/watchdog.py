"""A deadline on one task's awaits that costs a timer only when it fires.

``asyncio.timeout`` arms and cancels a timer for every await it guards; the Node guards every
upstream read and every frame from the Edge, and those timers were about 5 % of its CPU per
request (docs/performance-history.md). A ``Watchdog`` keeps one timer per task: ``until``
before an await only moves the due time (the timer is re-armed only for an earlier one);
``clear`` after it lifts the deadline. When the timer fires before the due time it re-arms
itself for it; once the due time has passed while the task waits, it cancels the task, and
``took`` tells the waiting code that this cancel was the watchdog's, as ``asyncio.timeout``
turns its own cancel into ``TimeoutError``.
"""

from __future__ import annotations

import asyncio
import math


class Watchdog:
    """Deadlines for the awaits of the task that made it (between ``until`` and ``clear``,
    the task must be waiting: the cancel is delivered to that await)."""

    __slots__ = ("_due", "_handle", "_loop", "_task", "fired")

    def __init__(self) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a Watchdog guards a task: make it inside one")
        self._loop = asyncio.get_running_loop()
        self._task = task
        self._due = math.inf
        self._handle: asyncio.TimerHandle | None = None
        self.fired = False  # its cancel is pending or not yet taken by ``took``

    def until(self, due: float) -> None:
        """The coming await must end by ``due``, in the loop's time."""
        self._due = due
        handle = self._handle
        if handle is None or handle.when() > due:
            if handle is not None:
                handle.cancel()
            self._handle = self._loop.call_at(due, self._check)

    def within(self, seconds: float) -> None:
        self.until(self._loop.time() + seconds)

    def clear(self) -> None:
        """The await ended: no deadline until the next ``until``."""
        self._due = math.inf

    def took(self) -> bool:
        """After a ``CancelledError``: True when it was this watchdog's cancel alone (taken
        back; the caller raises its own timeout), False when it must propagate."""
        if not self.fired:
            return False
        self.fired = False
        return self._task.uncancel() == 0

    def close(self) -> None:
        self._due = math.inf
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        self._handle = None
        if self._due == math.inf:
            return
        if self._loop.time() < self._due:
            self._handle = self._loop.call_at(self._due, self._check)
            return
        self._due = math.inf
        self.fired = True
        self._task.cancel()
