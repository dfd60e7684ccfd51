"""A runtime companion that runs one background task while the Edge runs (the revision and
route-table watchers): ``start`` once the loop runs, ``aclose`` cancels and awaits it."""

from __future__ import annotations

import asyncio
import contextlib


class TaskCompanion:
    """Subclasses give ``_run`` (the loop) and may give ``_first`` (awaited by ``start``)."""

    task_name = "companion"

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            await self._first()
            self._task = asyncio.create_task(self._run(), name=self.task_name)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _first(self) -> None:
        """What must be done before the Edge says it is ready (nothing by default)."""

    async def _run(self) -> None:
        raise NotImplementedError
