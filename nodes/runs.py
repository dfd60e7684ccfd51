"""A run's output channel from a Node to the request that owns it (Django-free)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from nodes import wire
from nodes.envelope import SlotGrant


class NodeUnavailable(Exception):
    """The lease's Node has no dispatch-ready connection any more."""

    code = "no_available_provider"  # the HTTP error the request ends with (docs/http-api.md)
    public_message = "the provider's node is not connected"


@dataclass(frozen=True, slots=True)
class RunOrder:
    """What the HTTP surface asks a Node to run."""

    tunnel: bool  # True: TunnelRequest (passthrough); False: RunRequest (normalized), R-POOL-10
    operation: str
    stream: bool
    body: bytes
    forward_headers: tuple[tuple[str, str], ...] = ()
    # Managed mode: issues the run's lease envelope once its id and the Node's connection
    # generation are known, (run_id, node_id, generation) -> envelope (R-MGD-4).
    seal: Callable[[str, str, int], dict[str, Any]] | None = None
    request_id: str = ""  # R-OBS-1: the request this run serves
    traceparent: str = ""  # R-OBS-2: the W3C trace context the Node's spans continue
    # Managed mode across Edges: what the Edge holding the Node needs to issue the envelope
    # itself, with its own connection generation (R-SCALE-7); None on a legacy run.
    grant: SlotGrant | None = None


Grant = Callable[[int], None]


class RunChannel:
    """Output of one run, in order, ending with exactly one terminal ``RunEnd``.

    ``finish`` is idempotent: the first terminal wins, a duplicated or late one is
    ignored, so a run can never end twice (R-POOL-9).

    With a ``window`` (R-IN-5) the Node may have at most that many characters outstanding:
    received here and not yet released by the reader (taken and handed to a client socket
    that took them). Released characters go back to the Node as credit in batches of a
    quarter window; a Node that sends past its window is refused (``feed`` returns False),
    so the queue is bounded.

    Held streams keep little: the queue is made on an item's arrival and dropped once read
    (an empty ``deque`` already holds a 64-slot block), and a reader waits on a bare future
    (``wait``), not a coroutine (docs/performance-history.md, "Open streams").
    """

    __slots__ = ("_grant", "_items", "_taken", "_unreturned", "_waiter", "end", "held",
                 "node_id", "outstanding", "request_id", "run_id", "window")  # fmt: skip

    def __init__(
        self,
        run_id: str,
        node_id: str,
        window: int = 0,
        grant: Grant | None = None,
        *,
        request_id: str = "",
    ) -> None:
        self.run_id = run_id
        self.node_id = node_id
        self.request_id = request_id  # R-OBS-1: lines logged outside the request's task
        self.end: wire.RunEnd | None = None
        # What is received and not yet read (None: nothing); one reader waits on ``_waiter``.
        self._items: deque[str | wire.RunEnd] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.window = window
        self._grant = grant
        self.outstanding = 0  # characters received and not yet released
        self._taken = 0  # characters taken by the reader and not yet released
        self._unreturned = 0  # released characters not yet granted back to the Node
        self.held = False  # the reader waits for its client to read (R-IN-5)

    @property
    def finished(self) -> bool:
        return self.end is not None

    def feed(self, data: str) -> bool:
        """Queue output; False when it exceeds the Node's window (a protocol violation)."""
        if self.end is None:
            if self.window and self.outstanding + len(data) > self.window:
                return False
            self.outstanding += len(data)
            self._put(data)
        return True

    def _put(self, item: str | wire.RunEnd) -> None:
        items = self._items
        if items is None:
            items = self._items = deque()
        items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def hold(self) -> None:
        """What was taken is written but its client has not read it yet."""
        self.held = True

    def release(self, chars: int | None = None) -> None:
        """Everything taken so far (or its first ``chars`` characters, for a reader that
        forwards part of what it took) has left the Edge: return it to the Node as credit."""
        self.held = False
        chars = self._taken if chars is None else min(chars, self._taken)
        self._taken -= chars
        self.outstanding -= chars
        if self._grant is None or self.end is not None or not chars:
            return
        self._unreturned += chars
        if self._unreturned * 4 >= self.window:
            returned, self._unreturned = self._unreturned, 0
            self._grant(returned)

    def log_context(self) -> dict[str, str]:
        """``extra`` for a log line about this run written outside its request's task."""
        return {"request_id": self.request_id, "run_id": self.run_id, "node": self.node_id}

    def finish(self, end: wire.RunEnd) -> bool:
        if self.end is not None:
            return False
        self.end = end
        self._put(end)
        return True

    def fail(self, code: str, message: str) -> bool:
        return self.finish(
            wire.RunEnd(
                run_id=self.run_id, ok=False, error=wire.RunError(code=code, message=message)
            )
        )

    async def get(self) -> str | wire.RunEnd:
        while (item := self.get_nowait()) is None:
            await self.wait()
        return item

    def wait(self) -> Awaitable[None]:
        """Done once an item is queued (at once when one is): for a reader that takes items
        with ``get_nowait``, without a coroutine of its own while it waits."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            raise RuntimeError(f"run {self.run_id} already has a reader")
        waiter = asyncio.get_running_loop().create_future()
        if self._items:
            waiter.set_result(None)
        else:
            self._waiter = waiter
        return waiter

    def get_nowait(self) -> str | wire.RunEnd | None:
        items = self._items
        if not items:
            return None
        item = items.popleft()
        if not items:
            self._items = None
        return self._took(item)

    def _took(self, item: str | wire.RunEnd) -> str | wire.RunEnd:
        if isinstance(item, str):
            self._taken += len(item)
        return item


class RunOutput(Protocol):
    """What a run's output is read from: a ``RunChannel`` or a filter over one."""

    @property
    def run_id(self) -> str: ...

    @property
    def node_id(self) -> str: ...

    def get_nowait(self) -> str | wire.RunEnd | None: ...

    def wait(self) -> Awaitable[object]:
        """Done when ``get_nowait`` may have an item (or, for a filter, work to do)."""
        ...

    def hold(self) -> None: ...

    def release(self) -> None: ...


class FilteredRun:
    """A run's output seen through a filter (a translation, the stream gate): what ``_take``
    makes of each item of ``source`` is read in order, with the run's own id, Node and flow
    control. Subclasses write ``_take``; they may put zero or more items in ``_out``."""

    __slots__ = ("_out", "_src")

    def __init__(self, source: RunOutput) -> None:
        self._src = source
        self._out: deque[str | wire.RunEnd] = deque()

    @property
    def run_id(self) -> str:
        return self._src.run_id

    @property
    def node_id(self) -> str:
        return self._src.node_id

    def get_nowait(self) -> str | wire.RunEnd | None:
        while not self._out:
            item = self._src.get_nowait()
            if item is None:
                return None
            self._take(item)
        return self._out.popleft()

    async def get(self) -> str | wire.RunEnd:
        while (item := self.get_nowait()) is None:
            await self.wait()
        return item

    def wait(self) -> Awaitable[object]:
        return self._src.wait()

    def hold(self) -> None:
        self._src.hold()

    def release(self) -> None:
        self._src.release()

    def _take(self, item: str | wire.RunEnd) -> None:
        raise NotImplementedError
