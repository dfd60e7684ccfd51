"""A loopback aiohttp server that records requests, tracks concurrency and injects faults."""

from __future__ import annotations

import asyncio
import contextvars
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Self

import msgspec
from aiohttp import web


@dataclass
class Recorded:
    """One request as the upstream saw it, and what it sent back."""

    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    response: bytearray = field(default_factory=bytearray)
    status: int = 0

    @property
    def json(self) -> Any:
        return msgspec.json.decode(self.body) if self.body else None


_current: contextvars.ContextVar[Recorded] = contextvars.ContextVar("recorded")


def current() -> Recorded:
    """The request being handled, as recorded."""
    return _current.get()


@dataclass
class Faults:
    """What to break. Times are seconds; ``math.inf`` stalls until the client leaves."""

    status: int | None = None  # answer with this status and an error body
    error_message: str = "injected failure"
    retry_after: str | None = None  # a Retry-After header on the error answer
    reset_before_headers: bool = False  # close the connection before any status line
    stall_before_first_byte: float | None = None  # before the status line
    stall_mid_stream: float | None = None  # after the first chunk
    drop_mid_stream: bool = False  # close the connection after the first chunk
    hold_mid_stream: asyncio.Event | None = None  # after the first chunk, wait until set
    delay: float = 0.0  # between chunks
    stream_error: bool = False  # the API's own in-band error event after the first content
    end_early: bool = False  # the stream ends cleanly after the first content, no stop event
    linger_after_end: float = 0.0  # after the last chunk, keep the response open this long
    redirect_to: str | None = None  # answer 307 with this Location
    set_cookie: str | None = None  # add this Set-Cookie to every answer
    endless_body: bytes | None = None  # send this chunk again and again (bounded below)
    # A degenerate loop: ``loop_prefix`` then ``loop_unit`` repeated ``loop_copies`` times, sent
    # in pieces of ``loop_piece`` code points; only the first ``loop_requests`` streamed
    # requests loop (None: every one).
    loop_unit: str | None = None
    loop_prefix: str = ""
    loop_copies: int = 60
    loop_piece: int = 7
    loop_requests: int | None = None
    loops_sent: int = 0


def loop_text(faults: Faults) -> list[str] | None:
    """The pieces of the injected loop for this request, or None when it answers normally."""
    if faults.loop_unit is None:
        return None
    if faults.loop_requests is not None and faults.loops_sent >= faults.loop_requests:
        return None
    faults.loops_sent += 1
    text = faults.loop_prefix + faults.loop_unit * faults.loop_copies
    step = max(1, faults.loop_piece)
    return [text[i : i + step] for i in range(0, len(text), step)]


def pieces(text: str) -> list[str]:
    """Split text into word-sized stream pieces (each keeps its trailing space)."""
    return re.findall(r"\S+\s*", text) or [text]


ENDLESS_BODY_MAX_BYTES = 1024**3  # the "huge body" fault stops here even if nobody does


class FakeServer:
    """Base of the fake upstreams: 127.0.0.1, port 0 unless told otherwise."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.faults = Faults()
        self.current = 0
        self.peak = 0
        self.disconnected = asyncio.Event()  # a client left before its response ended
        self.streaming = asyncio.Event()  # a streamed response has sent its first chunk
        self._arrived = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.endless_sent = 0  # bytes the endless_body fault wrote before the client left

    # --- lifecycle -----------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        raise NotImplementedError

    async def start(self, port: int = 0) -> Self:
        app = web.Application(middlewares=[self._record], client_max_size=64 * 1024 * 1024)
        app.add_routes(self.routes())
        # handler_cancellation: a handler learns at once that its client went away.
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def wait_requests(self, count: int, within: float = 5.0) -> list[Recorded]:
        """Wait until at least ``count`` requests have arrived."""
        async with asyncio.timeout(within), self._arrived:
            await self._arrived.wait_for(lambda: len(self.requests) >= count)
        return self.requests

    async def wait_concurrent(self, count: int, within: float = 5.0) -> None:
        """Wait until ``count`` requests are being handled at the same time."""
        async with asyncio.timeout(within), self._arrived:
            await self._arrived.wait_for(lambda: self.current >= count)

    # --- plumbing ------------------------------------------------------------------------

    @web.middleware
    async def _record(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        rec = Recorded(
            method=request.method,
            path=request.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=await request.read(),
        )
        _current.set(rec)  # the handler runs in this task: current() finds it
        self.requests.append(rec)
        self.current += 1
        self.peak = max(self.peak, self.current)
        async with self._arrived:
            self._arrived.notify_all()
        try:
            response = await handler(request)
            if self.faults.set_cookie is not None and not response.prepared:
                response.headers["Set-Cookie"] = self.faults.set_cookie
            return response
        except asyncio.CancelledError:
            self.disconnected.set()
            raise
        finally:
            self.current -= 1

    async def stall(self, seconds: float) -> None:
        if math.isinf(seconds):
            await asyncio.Event().wait()  # until the client leaves (handler cancelled)
        await asyncio.sleep(seconds)

    async def fail_if_told(self, request: web.Request) -> web.StreamResponse | None:
        """The injected error response, in the OpenAI/Anthropic error shape."""
        if self.faults.stall_before_first_byte is not None:
            await self.stall(self.faults.stall_before_first_byte)
        if self.faults.redirect_to is not None:
            current().status = 307
            return web.Response(status=307, headers={"Location": self.faults.redirect_to})
        if self.faults.endless_body is not None:
            return await self._endless(request, self.faults.endless_body)
        if self.faults.reset_before_headers:
            assert request.transport is not None
            request.transport.abort()  # the client reads a closed connection, no headers
            raise asyncio.CancelledError
        if self.faults.status is None:
            return None
        body = {"error": {"message": self.faults.error_message, "type": "fake_error"}}
        current().status = self.faults.status
        headers = {"Retry-After": self.faults.retry_after} if self.faults.retry_after else None
        return web.json_response(body, status=self.faults.status, headers=headers)

    async def _endless(self, request: web.Request, chunk: bytes) -> web.StreamResponse:
        """A body that does not end: writes until the client leaves (or 1 GiB)."""
        current().status = 200
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        self.endless_sent = 0
        try:
            while self.endless_sent < ENDLESS_BODY_MAX_BYTES:
                await resp.write(chunk)
                self.endless_sent += len(chunk)
        except (ConnectionResetError, ConnectionError):
            self.disconnected.set()
        return resp

    def reply(self, request: web.Request, obj: Any, status: int = 200) -> web.Response:
        raw = msgspec.json.encode(obj)
        rec = current()
        rec.status = status
        rec.response += raw
        return web.Response(body=raw, status=status, content_type="application/json")

    async def stream(
        self, request: web.Request, chunks: list[str], content_type: str
    ) -> web.StreamResponse:
        """Send ``chunks`` one write each, applying mid-stream faults after the first."""
        rec = current()
        resp = web.StreamResponse(status=200, headers={"Content-Type": content_type})
        rec.status = 200
        await resp.prepare(request)
        try:
            for i, chunk in enumerate(chunks):
                if i == 1:
                    if self.faults.drop_mid_stream:
                        assert request.transport is not None
                        request.transport.abort()
                        return resp
                    if self.faults.hold_mid_stream is not None:
                        await self.faults.hold_mid_stream.wait()
                    if self.faults.stall_mid_stream is not None:
                        await self.stall(self.faults.stall_mid_stream)
                if i >= 1 and self.faults.delay:
                    await asyncio.sleep(self.faults.delay)
                data = chunk.encode()
                await resp.write(data)
                rec.response += data
                if i == 0:
                    self.streaming.set()
            if self.faults.linger_after_end:  # the terminal event is out, the exchange is not
                await asyncio.sleep(self.faults.linger_after_end)
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            self.disconnected.set()
        return resp
