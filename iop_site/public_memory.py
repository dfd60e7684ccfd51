"""What the public listener keeps per connection and per request, made smaller: a held
stream's connection keeps these for as long as it is open (docs/performance-history.md,
"Open streams").

asyncio's ``Event`` and ``collections.deque`` each start with a 64-slot block (760 bytes
empty); uvicorn makes one deque per connection (its queue of pipelined requests) and two
events (the socket's write flow, per connection; a request's ``receive``, per request),
though a held stream waits on none of them. ``GuardedProtocol`` (``iop_site.public_http``)
puts these in their place, with the same methods uvicorn calls.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

# scope["asgi"]: uvicorn makes this dict per request; read-only for every app here.
ASGI_INFO = {"version": "3.0", "spec_version": "2.3"}


class SparseEvent:
    """``asyncio.Event``'s ``set``, ``clear``, ``is_set`` and ``wait`` on one loop, whose
    list of waiters exists only while one waits."""

    __slots__ = ("_value", "_waiters")

    def __init__(self) -> None:
        self._value = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._value

    def set(self) -> None:
        if self._value:
            return
        self._value = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._value = False

    async def wait(self) -> Literal[True]:
        if self._value:
            return True
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            waiters = self._waiters
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    self._waiters = None
        return True


class Pipeline(list[Any]):
    """uvicorn's queue of pipelined requests (``appendleft``, ``pop``, truth) as a list: a
    client rarely pipelines, and an empty list is 56 bytes."""

    __slots__ = ()

    def appendleft(self, item: Any) -> None:
        self.insert(0, item)
