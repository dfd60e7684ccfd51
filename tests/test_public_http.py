"""The public listener's guards on uvicorn's protocol (iop_site/public_http.py), driven in
memory on a real loop with a recording transport: R-IN-1 (declared and chunked bodies over the
limit), R-IN-5 (the header deadline, the write flow), the header bound, and R-OBS-1 on a
refusal. Each test fails if uvicorn moves the parser callback its guard hooks. The same guards
through a real Edge: tests/test_hostile_clients_e2e.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from iop_site.public_http import MAX_HEADERS, FlowWatch, Guard, GuardedProtocol
from iop_site.public_memory import Pipeline, SparseEvent
from pool.http.relay import CLIENT_GONE, WRITE_FLOW

LIMIT = 1024


class Transport(asyncio.Transport):
    """What the protocol writes, whether it half-closed, closed or aborted."""

    def __init__(self) -> None:
        super().__init__()
        self.data = b""
        self.eof = self.closed = self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.data += bytes(data)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class App:
    """Records every scope it is called with and reads the whole body."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []
        self.messages: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        while True:
            message = await receive()
            self.messages.append(message)
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                break
        if self.messages[-1]["type"] == "http.disconnect":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _protocol(
    app: App, header_timeout_s: float = 5.0, body_idle_s: float = 60.0
) -> tuple[GuardedProtocol, Transport]:
    config = Config(
        app, lifespan="off", ws="none", proxy_headers=False, log_config=None, access_log=False
    )
    config.load()
    protocol = GuardedProtocol(Guard(LIMIT, header_timeout_s, body_idle_s), config, ServerState())
    transport = Transport()
    protocol.connection_made(transport)
    return protocol, transport


def _head(transport: Transport) -> tuple[int, dict[bytes, bytes], bytes]:
    head, _, body = transport.data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    fields = dict(line.lower().split(b": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), fields, body


async def test_r_in_1_a_declared_length_over_the_limit_is_answered_before_the_app_runs() -> None:
    app = App()
    protocol, transport = _protocol(app)
    protocol.data_received(
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n"
    )
    status, fields, body = _head(transport)
    assert status == 413 and fields[b"connection"] == b"close"
    assert json.loads(body)["error"]["type"] == "request_too_large"  # the Anthropic shape
    assert transport.eof and not transport.aborted  # half-closed: the answer goes out
    written = transport.data
    protocol.data_received(b"x" * 4096)  # discarded
    await asyncio.sleep(0)
    assert app.scopes == [] and transport.data == written


async def test_a_refusal_carries_the_callers_request_id_or_a_new_one_r_obs_1() -> None:
    for given, expected in ((b"caller-413", b"caller-413"), (b"bad id", None)):
        protocol, transport = _protocol(App())
        protocol.data_received(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: " + given
            + b"\r\nContent-Length: 99999999\r\n\r\n"
        )  # fmt: skip
        status, fields, body = _head(transport)
        assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
        if expected is None:
            assert fields[b"x-request-id"] not in (b"", given)
        else:
            assert fields[b"x-request-id"] == expected


async def test_r_in_1_chunked_bytes_are_counted_as_they_come_and_the_app_sees_the_client_gone(
) -> None:  # fmt: skip
    app = App()
    protocol, transport = _protocol(app)
    protocol.data_received(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"200\r\n" + b"x" * 0x200 + b"\r\n"
    protocol.data_received(chunk)
    await asyncio.sleep(0)
    assert len(app.scopes) == 1 and transport.data == b""  # under the limit: the app reads
    protocol.data_received(chunk + chunk)  # now past it
    status, _, _ = _head(transport)
    assert status == 413
    for _ in range(5):
        await asyncio.sleep(0)
    assert app.messages[-1]["type"] == "http.disconnect"  # the app stops reading


async def test_request_line_and_headers_are_bounded_in_bytes_and_fields() -> None:
    too_long = b"GET /v1/models?" + b"q" * 17000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    many = b"GET /v1/models HTTP/1.1\r\n" + b"".join(
        b"X-F%d: 1\r\n" % i for i in range(MAX_HEADERS + 1)
    ) + b"\r\n"  # fmt: skip
    for request in (too_long, many):
        app = App()
        protocol, transport = _protocol(app)
        protocol.data_received(request)
        status, fields, body = _head(transport)
        assert status == 431 and fields[b"connection"] == b"close"
        assert json.loads(body)["error"]["code"] == "request_headers_too_large"
        await asyncio.sleep(0)
        assert app.scopes == []


async def test_r_in_5_the_header_deadline_is_armed_on_connection_and_aborts_it() -> None:
    protocol, transport = _protocol(App(), header_timeout_s=0.01)
    protocol.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # half
    await asyncio.wait_for(_until(lambda: transport.aborted), 5)
    assert transport.data == b""


async def test_r_in_5_complete_headers_end_the_deadline_and_a_next_request_arms_it_again(
) -> None:  # fmt: skip
    app = App()
    protocol, _ = _protocol(app, header_timeout_s=30)
    assert protocol._deadline is not None  # armed when the connection opened
    protocol.data_received(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    assert protocol._deadline is None
    await _until(lambda: protocol.cycle.response_complete)
    assert protocol._deadline is None  # idle between requests: the keep-alive bound applies
    protocol.data_received(b"G")  # the first byte of the next request
    assert protocol._deadline is not None
    protocol.connection_lost(None)
    assert protocol._deadline is None


async def test_r_in_5_the_socket_pausing_pauses_the_apps_write_flow() -> None:
    app = App()
    protocol, _ = _protocol(app)
    protocol.data_received(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    await _until(lambda: app.scopes)
    flow = app.scopes[0]["extensions"][WRITE_FLOW]
    assert isinstance(flow, FlowWatch) and not flow.paused
    protocol.pause_writing()
    assert flow.paused
    assert await flow.writable(0.01) is False  # a client that reads nothing
    waiting = asyncio.ensure_future(flow.writable(5))
    await asyncio.sleep(0)
    protocol.resume_writing()
    assert await waiting is True and not flow.paused


async def _until(predicate: Any) -> None:
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    pytest.fail("condition not reached")


async def test_what_the_parser_refuses_is_a_400_in_the_apis_shape_not_uvicorns_text() -> None:
    app = App()
    protocol, transport = _protocol(app)
    protocol.data_received(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nBad: a\x07b\r\n\r\n")
    status, fields, body = _head(transport)
    assert status == 400 and fields[b"content-type"] == b"application/json"
    assert json.loads(body)["error"]["code"] == "invalid_request"
    await asyncio.sleep(0)
    assert app.scopes == []


async def test_an_upgrade_request_is_served_as_plain_http_without_log_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nodes dial edge.listen: on the public listener a websocket upgrade is an ordinary
    request (the app answers it), and uvicorn's advice to install a websocket library is
    never logged."""
    app = App()
    protocol, _ = _protocol(app)
    protocol.data_received(
        b"GET /ws/node HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    await _until(lambda: protocol.cycle is not None and protocol.cycle.response_complete)
    assert app.scopes[0]["type"] == "http" and app.scopes[0]["path"] == "/ws/node"
    assert [r for r in caplog.records if r.name.startswith("uvicorn")] == []


async def test_r_in_5_a_body_that_stops_coming_closes_the_connection_and_the_app_sees_it(
) -> None:  # fmt: skip
    """Complete headers end the header deadline; a body that then stalls is bounded too
    (Twisted's idle timeout did it on daphne's listeners)."""
    app = App()
    protocol, transport = _protocol(app, body_idle_s=0.01)
    protocol.data_received(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"x" * 10
    )
    assert protocol._body_timer is not None
    await _until(lambda: transport.aborted)
    protocol.connection_lost(None)  # what the transport's abort leads to
    await _until(lambda: bool(app.messages) and app.messages[-1]["type"] == "http.disconnect")


async def test_a_body_that_came_with_its_headers_arms_no_body_timer() -> None:
    app = App()
    protocol, transport = _protocol(app, body_idle_s=0.01)
    protocol.data_received(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok"
    )
    assert protocol._body_timer is None
    await _until(lambda: protocol.cycle.response_complete)
    assert not transport.aborted


async def test_the_public_server_serves_with_nodelay_and_a_date_then_drains() -> None:
    """``PublicServer`` on a real loopback socket: answers with a ``date`` header, its
    connections send small writes at once (TCP_NODELAY, as daphne's listeners do), a stop
    refuses new connections, and ``aclose`` ends the open ones."""
    import socket

    from iop_site.public_http import PublicServer
    from tests.support import free_port

    server = PublicServer("127.0.0.1", free_port(), Guard(LIMIT, 5.0), None)
    server.bind()
    await server.start(App())
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200 ") and b"\r\ndate: " in head
    (connection,) = server._state.connections
    sock = connection.transport.get_extra_info("socket")
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    server.stop_accepting()
    with pytest.raises(OSError):
        await asyncio.wait_for(asyncio.open_connection("127.0.0.1", server.port), 5)
    await server.aclose(grace_s=1.0)
    # read() returns at end of stream: the rest of the answer, then the server closed it
    assert await asyncio.wait_for(reader.read(), 5) == b"2\r\nok\r\n0\r\n\r\n"
    writer.close()


async def test_a_body_past_the_limit_after_the_app_answered_closes_without_a_second_answer(
) -> None:  # fmt: skip
    """An app may answer before reading the body (a 401 needs only the headers): the body
    passing the limit after that ends the connection, and no 413 follows the answer."""

    async def early(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b"no"})

    config = Config(early, lifespan="off", ws="none", proxy_headers=False, log_config=None,
                    access_log=False)  # fmt: skip
    config.load()
    protocol = GuardedProtocol(Guard(LIMIT, 5.0), config, ServerState())
    transport = Transport()
    protocol.connection_made(transport)
    protocol.data_received(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    await _until(lambda: protocol.cycle.response_complete)
    chunk = b"200\r\n" + b"x" * 0x200 + b"\r\n"
    protocol.data_received(chunk * 3)  # past the limit
    assert transport.closed and transport.data.count(b"HTTP/1.1 ") == 1
    assert transport.data.startswith(b"HTTP/1.1 401 ")


async def test_an_idle_keep_alive_connection_is_closed_after_the_keep_alive_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bound between requests (60 s as shipped; 1 s here) ends an idle connection that
    has been answered, on a real socket."""
    from iop_site import public_http
    from tests.support import free_port

    monkeypatch.setattr(public_http, "KEEP_ALIVE_S", 1.0)
    server = public_http.PublicServer("127.0.0.1", free_port(), Guard(LIMIT, 5.0), None)
    server.bind()
    await server.start(App())
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 ") and b"connection: close" not in head
        # read() returns at end of stream: the rest of the answer, then the idle close,
        # within 3 s (uvicorn's own default, 5 s, would not close it in time)
        assert await asyncio.wait_for(reader.read(), 3) == b"2\r\nok\r\n0\r\n\r\n"
        writer.close()
    finally:
        await server.aclose(grace_s=1.0)


class Watching:
    """An app that registers ``when_gone`` (CLIENT_GONE) and waits; records each loss."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.gone: list[str] = []
        self.release = asyncio.Event()
        self.ended = asyncio.Event()  # its callback forgotten, the app returned

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        when_gone = scope["extensions"][CLIENT_GONE]
        path = scope["path"]
        when_gone(lambda: self.gone.append(path))
        self.started.set()
        await self.release.wait()
        when_gone(None)
        self.ended.set()


async def _watched(request: bytes) -> tuple[Watching, GuardedProtocol]:
    """A ``Watching`` app behind the protocol, running ``request`` (its first one)."""
    app = Watching()
    protocol, _ = _protocol(app)  # type: ignore[arg-type]
    protocol.data_received(request)
    async with asyncio.timeout(5):
        await app.started.wait()
    return app, protocol


async def test_the_app_hears_of_a_lost_client_from_the_callback_once() -> None:
    app, protocol = await _watched(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    assert app.gone == []
    protocol.connection_lost(None)
    protocol.connection_lost(None)  # a second report calls nothing twice
    assert app.gone == ["/v1/models"]
    app.release.set()


async def test_an_app_that_ended_hears_nothing_of_a_later_loss() -> None:
    app, protocol = await _watched(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    app.release.set()
    async with asyncio.timeout(5):
        await app.ended.wait()  # it called when_gone(None) on its way out
    protocol.connection_lost(None)
    assert app.gone == []


async def test_a_body_past_the_limit_while_the_app_runs_tells_the_app_its_client_is_gone(
) -> None:  # fmt: skip
    app, protocol = await _watched(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    protocol.data_received(b"800\r\n" + b"x" * 0x800 + b"\r\n")  # over LIMIT: refused
    assert app.gone == ["/v1/chat/completions"]
    app.release.set()


async def test_a_pipelined_requests_headers_keep_the_running_requests_watch() -> None:
    """A pipelined request's headers arrive while the first request's app still runs: the
    first one's registration is its own, and it hears when the connection is lost."""
    app, protocol = await _watched(
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/other HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    protocol.connection_lost(None)
    assert app.gone == ["/v1/models"]  # the second has not started: nothing registered yet
    app.release.set()


async def test_pipelined_requests_are_answered_in_order_on_the_small_queue() -> None:
    """uvicorn's queue of pipelined requests is a ``Pipeline`` (a list): two requests sent
    at once are answered first come, first served, and each one's ``receive`` waits on a
    ``SparseEvent`` (no deque per request or connection; iop_site/public_memory.py)."""
    app = App()
    protocol, transport = _protocol(app)
    assert isinstance(protocol.pipeline, Pipeline)
    assert isinstance(protocol.flow._is_writable_event, SparseEvent)
    protocol.data_received(
        b"GET /v1/first HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/second HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert isinstance(protocol.cycle.message_event, SparseEvent)
    await _until(lambda: transport.data.count(b"HTTP/1.1 200") == 2)
    assert [scope["path"] for scope in app.scopes] == ["/v1/first", "/v1/second"]
    assert not protocol.pipeline


async def test_a_sparse_event_wakes_its_waiters_and_keeps_no_list_when_none_waits() -> None:
    event = SparseEvent()
    assert await asyncio.wait_for(_set_soon(event), 5) is True
    assert event.is_set() and await event.wait() is True  # set: no wait at all
    event.clear()
    waiters = [asyncio.ensure_future(event.wait()) for _ in range(2)]
    await asyncio.sleep(0)
    gone = asyncio.ensure_future(event.wait())
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    event.set()
    assert await asyncio.gather(*waiters) == [True, True]
    assert event._waiters is None


async def _set_soon(event: SparseEvent) -> bool:
    asyncio.get_running_loop().call_soon(event.set)
    return await event.wait()
