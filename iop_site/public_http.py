"""The public listener (``openai.listen``: ``/v1``, the admin, the REST API, the status page)
served by uvicorn's httptools protocol on the loop daphne's Twisted reactor runs on; the Node
listener and the control listener stay on daphne (docs/architecture.md, "Listeners").

Measured beside daphne in one ``make bench`` run: Edge CPU per non-stream request at c=16
0.32 → 0.24 ms, per stream 0.41 → 0.26 ms (docs/performance.md). What ``twisted_guards`` does
on daphne's listeners, ``GuardedProtocol`` does here, before the app runs:

- R-IN-1: a declared ``Content-Length`` over the limit, or chunked bytes past it, is answered
  413 ``request_too_large`` at once, before authentication.
- R-IN-5: a connection without complete headers ``header_timeout_s`` after its first byte (or
  after it opened) is closed; an idle keep-alive connection after ``KEEP_ALIVE_S``, and one
  whose request body stops coming for ``KEEP_ALIVE_S`` (Twisted's idle timeout did both).
- Request line and headers together at most ``MAX_HEADER_BYTES``, at most ``MAX_HEADERS``
  fields (Twisted's own limits on the daphne listeners): else 431 and close.
- R-IN-5: the client socket's write side is the app's ``WriteFlow`` (``iop.write_flow``).
- The app learns that its client is gone from a callback (``iop.client_gone``), without a
  task reading ``receive`` per request.

The hook points are uvicorn's ``HttpToolsProtocol`` parser callbacks; uvicorn is pinned and
``tests/test_public_http.py`` fails if one moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from edgekit.http import LINGER_S, closing_answer, header
from iop_site.public_memory import ASGI_INFO, Pipeline, SparseEvent
from obskit.context import request_id_from
from pool.http.errors import HttpError, error_json, request_too_large
from pool.http.relay import CLIENT_GONE, WRITE_FLOW

log = logging.getLogger("iop.edge")

BACKLOG = 1024  # as on daphne's listeners (iop_site/tls.py)
MAX_HEADER_BYTES = 16 * 1024  # request line and header fields, as Twisted's totalHeadersSize
MAX_HEADERS = 500  # as Twisted's maxHeaders
KEEP_ALIVE_S = 60.0  # an idle keep-alive connection is closed after this
DATE_TICK_S = 1.0


@dataclass(frozen=True, slots=True)
class Guard:
    """The limits of the public listener (``openai.max_request_bytes``,
    ``openai.header_timeout_s``; a stalled body after ``body_idle_s``)."""

    max_body_bytes: int
    header_timeout_s: float
    body_idle_s: float = KEEP_ALIVE_S


class FlowWatch:
    """``WriteFlow`` over uvicorn's flow control: paused while the socket's write buffer is
    over its high-water mark; resumed when it drains or the connection is lost."""

    __slots__ = ("_flow",)

    def __init__(self, flow: FlowControl) -> None:
        self._flow = flow

    @property
    def paused(self) -> bool:
        return self._flow.write_paused

    async def writable(self, timeout_s: float) -> bool:
        if not self._flow.write_paused:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                await self._flow.drain()
        except TimeoutError:
            return False
        return True


class _GoneWatch:
    """One request's ``when_gone`` (``CLIENT_GONE``): its app's callback, called once when the
    connection is lost. Per request: a pipelined request's app may still run beside the next."""

    __slots__ = ("_callback", "_watches")

    def __init__(self, watches: list[_GoneWatch]) -> None:
        self._watches = watches
        self._callback: Callable[[], None] | None = None

    def __call__(self, callback: Callable[[], None] | None) -> None:
        self._callback = callback
        if callback is None:
            if self in self._watches:
                self._watches.remove(self)
        elif self not in self._watches:
            self._watches.append(self)

    def fire(self) -> None:
        callback, self._callback = self._callback, None
        if callback is not None:
            callback()


class GuardedProtocol(HttpToolsProtocol):  # type: ignore[misc]
    """uvicorn's HTTP/1.1 protocol with a header deadline, header and body limits and the
    write flow; a refused request never reaches the app."""

    def __init__(self, guard: Guard, config: Config, server_state: ServerState) -> None:
        super().__init__(config=config, server_state=server_state, app_state={})
        self.guard = guard
        self._deadline: asyncio.TimerHandle | None = None
        self._refused = False
        self._head_bytes = 0
        self._head_fields = 0
        self._body_bytes = 0
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_seen = 0.0
        self._watches: list[_GoneWatch] = []  # requests whose app waits to hear of a loss
        self._flow_watch: FlowWatch | None = None
        self.pipeline = Pipeline()  # uvicorn's deque, smaller (iop_site.public_memory)

    # --- connection ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        writable = SparseEvent()  # set, as uvicorn's FlowControl starts
        writable.set()
        self.flow._is_writable_event = writable
        self._flow_watch = FlowWatch(self.flow)
        self._arm(self.guard.header_timeout_s)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # answered: the rest is read and discarded until the linger ends
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.send_400_response("")  # the client's fault: no log line per bad request
            return
        except httptools.HttpParserUpgrade:
            return  # no upgrade here (Nodes dial edge.listen): served as a plain HTTP request
        cycle = self.cycle
        if (
            self._body_timer is None
            and cycle is not None
            and cycle.more_body
            and not (self._refused or cycle.response_complete or cycle.disconnected)
        ):  # a body still to come (one that came with its headers never arms this)
            self._body_seen = self.loop.time()
            self._body_timer = self.loop.call_later(self.guard.body_idle_s, self._body_idle)

    def _unsupported_upgrade_warning(self) -> None:
        """uvicorn would log two lines per ``Upgrade`` request, naming a websocket library to
        install: this listener serves none by design."""

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._end_body_timer()
        super().connection_lost(exc)
        self._client_gone()

    def _client_gone(self) -> None:
        watches, self._watches = self._watches, []
        for watch in watches:
            watch.fire()

    # --- parser callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["asgi"] = ASGI_INFO  # one dict for every request, not one each
        self._head_bytes = self._head_fields = self._body_bytes = 0
        if self._deadline is None:
            self._arm(self.guard.header_timeout_s)  # the first byte of a next request

    def on_url(self, url: bytes) -> None:
        if self._refused:
            return
        self._head_bytes += len(url)
        if self._head_bytes > MAX_HEADER_BYTES:
            self._refuse_head()
            return
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused:
            return
        self._head_bytes += len(name) + len(value) + 4
        self._head_fields += 1
        if self._head_bytes > MAX_HEADER_BYTES or self._head_fields > MAX_HEADERS:
            self._refuse_head()
            return
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        if self._refused:
            return
        declared = _content_length(self.headers)
        if declared is not None and declared > self.guard.max_body_bytes:
            self._refuse_body()  # R-IN-1: from the declared length, before any body byte
            return
        gone = _GoneWatch(self._watches)
        self.scope["extensions"] = {WRITE_FLOW: self._flow_watch, CLIENT_GONE: gone}
        previous = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not previous and cycle is not None:  # its task has not run yet
            cycle.message_event = SparseEvent()

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        self._body_bytes += len(body)
        if self._body_bytes > self.guard.max_body_bytes:  # R-IN-1: counted as decoded
            if self.cycle is not None and self.cycle.response_started:
                # The app answered before reading it all (a 401, say): no second answer on
                # the wire, and nothing more of this body is read.
                self._refused = True
                self.transport.close()
            else:
                self._refuse_body()
            return
        self._body_seen = self.loop.time()
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._end_body_timer()
        if not self._refused:
            super().on_message_complete()

    # --- refusals --------------------------------------------------------------------------

    def send_400_response(self, msg: str) -> None:
        """What the parser refuses (malformed syntax, a control character in a header value,
        a bad ``Content-Length``): 400 ``invalid_request`` in the API's shape, not uvicorn's
        plain text."""
        self._answer(
            b"400 Bad Request", HttpError("invalid_request", "the request is not valid HTTP/1.1")
        )

    def _refuse_body(self) -> None:
        limit = self.guard.max_body_bytes
        self._answer(b"413 Request Entity Too Large", request_too_large(limit))

    def _refuse_head(self) -> None:
        message = f"the request line and headers exceed {MAX_HEADER_BYTES} bytes or " + (
            f"{MAX_HEADERS} fields"
        )
        err = HttpError("request_headers_too_large", message)
        self._answer(b"431 Request Header Fields Too Large", err)

    def _answer(self, status: bytes, err: HttpError) -> None:
        """Answer ``err`` in the caller's API shape and close, discarding what the client
        sends; an app already running for this request sees the client gone."""
        if self._refused or self.transport is None or self.transport.is_closing():
            return
        self._refused = True
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
            self._client_gone()
        body = error_json(err, (self.url or b"").startswith(b"/v1/messages"))
        given = header(self.headers or [], b"x-request-id")
        self.transport.write(closing_answer(status, body, request_id_from(given)))
        self._unset_keepalive_if_required()
        # Half-close: the answer and a FIN go out; what the client still sends is discarded
        # for a short while so its TCP stack does not reset the answer away, then abort.
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._arm(LINGER_S)
        else:
            self.transport.close()

    # --- the deadline ----------------------------------------------------------------------

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        call, self._deadline = self._deadline, None
        if call is not None:
            call.cancel()

    def _expired(self) -> None:
        self._deadline = None
        if self.transport is not None:
            self.transport.abort()

    def _body_idle(self) -> None:
        """The body's last bytes came ``body_idle_s`` ago: the connection is closed (the app
        reading it sees the client gone); else the check is due again when they will be."""
        left = self._body_seen + self.guard.body_idle_s - self.loop.time()
        if left > 0:
            self._body_timer = self.loop.call_later(left, self._body_idle)
            return
        self._body_timer = None
        if self.transport is not None:
            self.transport.abort()

    def _end_body_timer(self) -> None:
        timer, self._body_timer = self._body_timer, None
        if timer is not None:
            timer.cancel()


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    value = header(headers, b"content-length")
    try:
        return None if value is None else int(value)
    except ValueError:
        return None  # the parser refuses it as a bad request


class PublicServer:
    """The public listener: bound at start (a busy port refuses the start), served once the
    loop runs, closed for new connections on drain, its connections ended after."""

    def __init__(
        self, host: str, port: int, guard: Guard, ssl_context: ssl.SSLContext | None
    ) -> None:
        self.host = host.strip("[]")
        self.port = port
        self.guard = guard
        self.ssl_context = ssl_context
        self._sock: socket.socket | None = None
        self._server: asyncio.Server | None = None
        self._state = ServerState()
        self._ticker: asyncio.TimerHandle | None = None

    def bind(self) -> None:
        """Bind and listen now; ``OSError`` when the address is taken or not local."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP named: asyncio's own loop turns Nagle off only on sockets that say so
        # (uvloop does either way); tests/test_public_http.py checks the accepted socket.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock

    async def start(self, app: Any) -> None:
        """Serve ``app`` on the bound socket (on the running loop)."""
        assert self._sock is not None, "bind() first"
        config = Config(
            app,
            interface="asgi3",  # the router is a plain function returning the app's coroutine
            lifespan="off",
            ws="none",
            proxy_headers=False,
            server_header=False,
            date_header=False,
            access_log=False,
            log_config=None,
            timeout_keep_alive=int(KEEP_ALIVE_S),
        )
        config.load()
        guard, state = self.guard, self._state
        self._tick_date()
        self._server = await asyncio.get_running_loop().create_server(
            lambda: GuardedProtocol(guard, config, state),
            sock=self._sock,
            ssl=self.ssl_context,
            ssl_handshake_timeout=guard.header_timeout_s if self.ssl_context else None,
            backlog=BACKLOG,
        )

    def stop_accepting(self) -> None:
        """No new connection; those open finish their requests."""
        if self._server is not None:
            self._server.close()
        elif self._sock is not None:
            self._sock.close()

    async def aclose(self, grace_s: float) -> None:
        """End every connection: idle ones now, busy ones after their response (within
        ``grace_s``), then whatever is left is cancelled."""
        self.stop_accepting()
        if self._ticker is not None:
            self._ticker.cancel()
        for connection in list(self._state.connections):
            connection.shutdown()
        tasks = set(self._state.tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
        for task in self._state.tasks:
            task.cancel()
        for connection in list(self._state.connections):
            with contextlib.suppress(Exception):
                connection.transport.abort()

    def _tick_date(self) -> None:
        """The ``date`` header every response carries, once a second."""
        self._state.default_headers = [(b"date", formatdate(usegmt=True).encode())]
        self._ticker = asyncio.get_running_loop().call_later(DATE_TICK_S, self._tick_date)
