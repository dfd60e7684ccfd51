"""Sending responses: whole bodies, relayed streams, errors, and the client-disconnect watch.

Under daphne a ``send`` to a gone client is dropped silently and the app learns of the
disconnect only from ``receive()`` (docs/architecture.md: streaming under daphne), so
every dispatched request runs beside a ``DisconnectWatch``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from edgekit.http import Receive, Send
from nodes import wire
from nodes.runs import RunOutput
from pool.http.body import ClientGone
from pool.http.errors import HttpError, error_json, from_run_error, stream_error_event
from pool.http.naming import ModelNames
from pool.http.spent import TERMINAL_GRACE_S, Spent, TextTally, ends_stream, text_chars

# What the relay reads a run's output from: the Node's ``RunChannel`` or a filter over it
# (``pool.translate.channel``, ``pool.http.gated``).
RunSource = RunOutput


PING_INTERVAL_S = 15.0  # an idle stream gets an SSE comment so a dead peer surfaces
PING = b": ping\n\n"
JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
CLIENT_CLOSED = 499  # metered status of a request whose client went away
WRITE_FLOW = "iop.write_flow"  # scope["extensions"] key: the client socket's WriteFlow
# scope["extensions"] key: ``when_gone(callback)`` calls ``callback`` once when the client's
# connection is lost (``when_gone(None)`` forgets it); the public listener's (public_http)
CLIENT_GONE = "iop.client_gone"
WhenGone = Callable[[Callable[[], None] | None], None]


class WriteFlow(Protocol):
    """Whether the client's socket takes more output (docs/architecture.md, R-IN-5)."""

    paused: bool

    async def writable(self, timeout_s: float) -> bool: ...


QUEUE_WAIT_HEADER = b"x-iop-queue-wait-ms"
QUEUE_ETA_HEADER = b"x-iop-queue-eta-ms"


class Exchange:
    """The response side of one request: what was sent, and what metering needs to know."""

    __slots__ = (
        "anthropic",
        "code",
        "done",
        "extra_headers",
        "flow",
        "in_band_failure",
        "output_bytes",
        "provider_id",
        "queue_eta_ms",
        "queue_wait_ms",
        "reached",
        "send",
        "spent",
        "started",
        "status",
        "stream",
        "tally",
        "terminal",
        "text_chars",
        "usage",
    )

    def __init__(self, send: Send, anthropic: bool, flow: WriteFlow | None = None) -> None:
        self.send = send
        self.anthropic = anthropic
        self.flow = flow
        self.started = False  # response headers sent
        self.done = False  # final body chunk sent
        self.stream = False
        self.status = 0
        self.code: str | None = None
        self.provider_id: str | None = None
        self.reached = True  # False: the request never reached an upstream (metered as 0)
        self.usage: wire.Usage | None = None
        self.output_bytes = 0
        self.extra_headers: list[tuple[bytes, bytes]] = []  # x-ratelimit-* (R-PRIN-2)
        self.queue_wait_ms = 0  # R-QUEUE-1: time in the queue, on every answer
        self.queue_eta_ms: int | None = None  # R-QUEUE-3: the estimate it queued on
        # R-BUD-2 (pool/http/spent.py): the stream's terminal event went out; model text
        # relayed (a whole body's, or a stream's tally: for an estimate); attempts discarded
        # on the way, metered on their own.
        self.terminal = False
        self.text_chars = 0
        self.tally: TextTally | None = None
        self.spent: list[Spent] = []
        # A translated stream's own end after a failure (a Responses stream: response.failed).
        self.in_band_failure: Callable[[str, str], str | None] | None = None

    async def respond(
        self, status: int, body: bytes, headers: list[tuple[bytes, bytes]] = JSON_HEADERS
    ) -> None:
        """A complete response in two sends."""
        self.status = status
        self.started = True
        headers = headers + self._own_headers()
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        self.done = True
        await self.send({"type": "http.response.body", "body": body})

    async def fail(self, err: HttpError) -> None:
        """Answer with ``err``: an error response, or an in-band event if a stream started."""
        self.status, self.code = err.status, err.code
        if not self.started:
            headers = JSON_HEADERS + err.headers() + self._own_headers()
            self.started = self.done = True
            await self.send(
                {"type": "http.response.start", "status": err.status, "headers": headers}
            )
            await self.send({"type": "http.response.body", "body": error_json(err, self.anthropic)})
        elif not self.done:  # never a silent truncation: the stream ends with the error
            self.done = True
            await self.send({"type": "http.response.body", "body": self.failure_event(err)})

    def _own_headers(self) -> list[tuple[bytes, bytes]]:
        """This request's headers beside the content's: limits, budget, translation, and
        its time in the queue (R-QUEUE-1: 0 when admitted at once)."""
        own = [*self.extra_headers, (QUEUE_WAIT_HEADER, b"%d" % self.queue_wait_ms)]
        if self.queue_eta_ms is not None:
            own.append((QUEUE_ETA_HEADER, b"%d" % self.queue_eta_ms))
        return own

    def failure_event(self, err: HttpError) -> bytes:
        """The in-band event that ends this stream after a failure: the translator's when it
        speaks for the client's protocol, else the error event of the client's API."""
        if self.in_band_failure is not None:
            text = self.in_band_failure(err.code, err.message)
            if text is not None:
                return text.encode()
        return stream_error_event(err, self.anthropic)

    @property
    def relayed_chars(self) -> int:
        """Model text relayed (R-BUD-2): the stream's tally, else the whole body's."""
        return self.tally.chars if self.tally is not None else self.text_chars

    def client_gone(self) -> None:
        """The client left; after the stream's terminal event the answer stands as sent."""
        self.done = True
        if not self.terminal:
            self.status, self.code = CLIENT_CLOSED, "client_closed"

    async def open_stream(self) -> None:
        if not self.started:
            self.started = True
            self.status = 200
            headers = SSE_HEADERS + self._own_headers()
            await self.send({"type": "http.response.start", "status": 200, "headers": headers})

    async def chunk(self, body: bytes, more: bool) -> None:
        self.output_bytes += len(body)
        if not more:
            self.done = True
        await self.send({"type": "http.response.body", "body": body, "more_body": more})

    async def drained(self, timeout_s: float) -> None:
        """Wait until the client's socket has taken what was written (R-IN-5); a client
        that reads nothing for ``timeout_s`` is treated as gone."""
        flow = self.flow
        if flow is not None and flow.paused and not await flow.writable(timeout_s):
            raise ClientGone


MAX_WHOLE_BODY_CHARS = 64 * 1024 * 1024  # a non-stream answer is buffered: bound it


async def relay_whole(
    channel: RunSource,
    ex: Exchange,
    silence_s: float = 600.0,
    names: ModelNames | None = None,
) -> wire.RunEnd:
    """A non-stream run: the Node's output is the response body, sent once the run ends ok."""
    parts: list[str] = []
    size = 0
    while True:
        item = channel.get_nowait()
        if item is None:
            try:
                with Within(silence_s):
                    await channel.wait()
            except TimeoutError:
                raise _silent(silence_s) from None
            continue
        if isinstance(item, str):
            size += len(item)
            if size > MAX_WHOLE_BODY_CHARS:
                raise HttpError("upstream_error", "the upstream's response is too large")
            parts.append(item)
            channel.release()  # held here, bounded by MAX_WHOLE_BODY_CHARS
            continue
        ex.usage = item.usage
        text = "".join(parts)
        if item.usage is None:  # R-BUD-2: the estimate when no usage came
            ex.text_chars = text_chars(text)
        if not item.ok:
            raise from_run_error(item.error, _run_label(channel))
        body = (names.whole(text) if names is not None else text).encode()
        ex.output_bytes = len(body)
        await ex.respond(200, body)
        return item


async def relay_stream(
    channel: RunSource,
    ex: Exchange,
    ping_s: float | None = None,
    silence_s: float = 600.0,
    names: ModelNames | None = None,
) -> wire.RunEnd:
    """Relay a streamed run chunk by chunk; chunks already queued go out in one send.

    A failure before any output raises ``RunFailed`` (an error response, or a retry); after
    output started it ends the stream with an in-band error event (never a silent
    truncation) and returns the failed end.
    """
    ex.stream = True
    ex.tally = TextTally()
    if ping_s is None:
        ping_s = PING_INTERVAL_S
    loop = asyncio.get_running_loop()
    while True:
        item = channel.get_nowait()
        if item is None:  # awaited here, not in a helper: a coroutine less per held stream
            deadline = loop.time() + silence_s
            while item is None:
                left = deadline - loop.time()
                if left <= 0:
                    raise _silent(silence_s)
                try:
                    with Within(min(ping_s, left)):
                        await channel.wait()
                except TimeoutError:
                    if ping_s <= left:  # a long silence commits the stream so pings can flow
                        await ex.open_stream()
                        await ex.send(
                            {"type": "http.response.body", "body": PING, "more_body": True}
                        )
                item = channel.get_nowait()
        end: wire.RunEnd | None = None
        if isinstance(item, str):
            parts = [item]
            while (more := channel.get_nowait()) is not None:
                if isinstance(more, str):
                    parts.append(more)
                else:
                    end = more
                    break
            text = parts[0] if len(parts) == 1 else "".join(parts)
            if names is not None:
                text = names.chunk(text) + (names.flush() if end is not None else "")
            ex.tally.add(text)
            body = text.encode()
        else:
            end, body = item, (names.flush().encode() if names is not None else b"")
        if end is None:
            await ex.open_stream()
            if body:
                await ex.chunk(body, True)
                if not ex.terminal:  # R-BUD-2: complete for the client from here on
                    ex.terminal = ends_stream(body)
            channel.hold()
            if not ex.terminal:  # R-IN-5: no more from the Node until the client reads
                await ex.drained(silence_s)
            channel.release()
            continue
        ex.usage = end.usage
        if end.ok:
            await ex.open_stream()
            await ex.chunk(body, False)
            return end
        err = from_run_error(end.error, _run_label(channel))
        if not ex.started and not body:
            raise err
        await ex.open_stream()
        ex.status, ex.code = err.status, err.code
        await ex.chunk(body + ex.failure_event(err), False)
        return end


class Within:
    """``with Within(seconds): await ...``: ``TimeoutError`` when the await takes longer,
    with ``asyncio.timeout``'s meaning (a cancel from elsewhere stays a cancel), but one timer
    handle and no coroutine of its own: under uvloop 1.3 µs over the bare wait where
    ``asyncio.timeout`` took 4.9 (docs/performance-history.md). Every wait of a run on the
    Edge goes through it (the silence backstop, a stream's pings)."""

    __slots__ = ("_cancelling", "_seconds", "_task", "_timer", "expired")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self.expired = False

    def __enter__(self) -> Within:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        self._timer = asyncio.get_running_loop().call_later(self._seconds, self._expire)
        return self

    def _expire(self) -> None:
        self.expired = True
        self._task.cancel()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._timer.cancel()
        if not self.expired:
            return
        # ours: that cancel is taken back; a timeout unless a cancel from elsewhere came too
        if self._task.uncancel() <= self._cancelling and kind is asyncio.CancelledError:
            raise TimeoutError from None


def _silent(silence_s: float) -> HttpError:
    """The Edge's backstop when a Node never ends a run (R-POOL-9): the caller's request ends
    and ``dispatch`` cancels the run on the Node and releases the lease."""
    return HttpError(
        "upstream_timeout", f"no output from the provider's node for {silence_s:.0f} s"
    )


class DisconnectWatch:
    """Cancels the request task when the client goes away, so the run and lease end at once.

    A disconnect after the final chunk (daphne reports one after every response) is
    ignored. After the stream's terminal event the run is read on for its usage (R-BUD-2),
    for at most ``TERMINAL_GRACE_S``. ``absorb`` tells whether a CancelledError was ours; any
    other cancellation (daphne's kill, shutdown) must propagate.

    With the listener's ``when_gone`` hook (``CLIENT_GONE``) the loss is a callback; else a
    task reads ``receive`` for ``http.disconnect``.
    """

    __slots__ = ("_armed", "_ex", "_grace", "_task", "_watcher", "_when_gone", "disconnected")

    def __init__(self, receive: Receive, ex: Exchange, when_gone: WhenGone | None = None) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._ex = ex
        self._armed = True
        self.disconnected = False
        self._grace: asyncio.TimerHandle | None = None
        self._when_gone = when_gone
        self._watcher: asyncio.Task[None] | None = None
        if when_gone is not None:
            when_gone(self._gone)
        else:
            self._watcher = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self._gone()
                return

    def _gone(self) -> None:
        if self._ex.terminal:
            loop = asyncio.get_running_loop()
            self._grace = loop.call_later(TERMINAL_GRACE_S, self._cancel)
        else:
            self._cancel()

    def _cancel(self) -> None:
        if self._armed and not self._ex.done:
            self.disconnected = True
            self._task.cancel()

    def absorb(self) -> bool:
        """True when the cancellation came from this watch alone; the task is then un-cancelled."""
        return self.disconnected and self._task.uncancel() == 0

    def stop(self) -> None:
        self._armed = False
        if self._when_gone is not None:
            self._when_gone(None)
        if self._watcher is not None:
            self._watcher.cancel()
        if self._grace is not None:
            self._grace.cancel()


def _run_label(channel: RunSource) -> str:
    """How a run is named in the Edge's log: its id and the Node it ran on."""
    return f"{channel.run_id} on node {channel.node_id}"
