"""The Edge side of nodes/wire.py, small enough for tests: accepts Nodes, registers them,
records what they send and lets the test drive runs, cancels and refreshes."""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from dataclasses import dataclass, field
from typing import Self

import msgspec
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from nodes import wire


@dataclass
class RunLog:
    """What one run sent back."""

    data: list[str] = field(default_factory=list)
    ends: list[wire.RunEnd] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)  # first run_event arrived

    @property
    def text(self) -> str:
        return "".join(self.data)


class EdgeConn:
    """One accepted Node connection (one generation)."""

    def __init__(self, ws: ServerConnection, generation: int) -> None:
        self.ws = ws
        self.generation = generation
        self.headers: Headers = ws.request.headers if ws.request else Headers()
        self.received: list[wire.NodeToEdge] = []  # everything, in order
        self.inbox: asyncio.Queue[wire.NodeToEdge] = asyncio.Queue()  # all but run traffic
        self.runs: dict[str, RunLog] = {}
        self.ready = asyncio.Event()
        self.closed = asyncio.Event()
        self.close_code: int | None = None

    async def send(self, message: wire.EdgeToNode) -> None:
        await self.ws.send(wire.encode(message), text=True)

    def run(self, run_id: str) -> RunLog:
        return self.runs.setdefault(run_id, RunLog())

    async def tunnel(
        self,
        run_id: str,
        provider_id: str,
        operation: str,
        body: object,
        *,
        stream: bool = False,
        forward_headers: dict[str, str] | None = None,
    ) -> RunLog:
        log = self.run(run_id)
        await self.send(
            wire.TunnelRequest(
                run_id=run_id,
                provider_id=provider_id,
                operation=operation,
                stream=stream,
                body=msgspec.Raw(msgspec.json.encode(body)),
                forward_headers=forward_headers or {},
            )
        )
        return log

    async def run_request(
        self,
        run_id: str,
        provider_id: str,
        body: object,
        *,
        stream: bool = False,
        operation: str = "chat_completions",
    ) -> RunLog:
        log = self.run(run_id)
        await self.send(
            wire.RunRequest(
                run_id=run_id,
                provider_id=provider_id,
                operation=operation,
                stream=stream,
                body=msgspec.Raw(msgspec.json.encode(body)),
            )
        )
        return log

    async def wait_end(self, run_id: str, within: float = 10.0) -> RunLog:
        log = self.run(run_id)
        async with asyncio.timeout(within):
            await log.done.wait()
        return log

    async def next_of(self, kind: type, within: float = 5.0) -> wire.NodeToEdge:
        """The next non-run message of ``kind`` (others before it are skipped)."""
        async with asyncio.timeout(within):
            while True:
                message = await self.inbox.get()
                if isinstance(message, kind):
                    return message


_quiet = logging.getLogger("tests.fake_edge")
_quiet.setLevel(logging.WARNING)


class FakeEdge:
    """A websocket server on 127.0.0.1 that plays the Edge for one node id."""

    def __init__(
        self,
        payload: wire.NodePayload,
        *,
        node_id: str = "node-test",
        token: str = "node-token-for-tests",
        heartbeat_interval_s: float = 15.0,
        heartbeat_timeout_s: float = 45.0,
        answer_pings: bool = True,
        ssl_context: ssl.SSLContext | None = None,
        protocol: int = wire.PROTOCOL_VERSION,
    ) -> None:
        self.payload = payload
        # R-HA-4: an Edge of 3 chooses the wire subprotocol the Node offers; one of 2 does not
        self.protocol = protocol
        self.node_id = node_id
        self.token = token
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.answer_pings = answer_pings
        self.ssl_context = ssl_context
        self.refused = 0  # upgrade requests answered 403
        self._refusals = asyncio.Condition()
        self.connections: asyncio.Queue[EdgeConn] = asyncio.Queue()  # each once ready
        self.all: list[EdgeConn] = []
        self._generations = itertools.count(1)
        self._server: Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        scheme = "wss" if self.ssl_context else "ws"
        return f"{scheme}://127.0.0.1:{self.port}/ws/node"

    async def start(self) -> Self:
        self._server = await serve(
            self._handle,
            "127.0.0.1",
            0,
            process_request=self._authorize,
            max_size=wire.MAX_MESSAGE_BYTES,
            compression=None,
            ping_interval=None,
            logger=_quiet,  # the server's DEBUG header dump would show the node token
            ssl=self.ssl_context,
            subprotocols=[Subprotocol(wire.WIRE_SUBPROTOCOL)] if self.protocol >= 3 else None,
        )
        self.port = next(iter(self._server.sockets)).getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def next_connection(self, within: float = 10.0) -> EdgeConn:
        """The next connection that completed register -> register_response -> ready."""
        async with asyncio.timeout(within):
            return await self.connections.get()

    async def _authorize(self, connection: ServerConnection, request: Request) -> Response | None:
        auth = request.headers.get("Authorization", "")
        node = request.headers.get(wire.NODE_ID_HEADER, "")
        if auth != f"Bearer {self.token}" or node != self.node_id:
            async with self._refusals:
                self.refused += 1
                self._refusals.notify_all()
            return connection.respond(403, "forbidden\n")
        return None

    async def wait_refused(self, count: int, within: float = 10.0) -> None:
        """Wait until ``count`` upgrade requests have been refused."""
        async with asyncio.timeout(within), self._refusals:
            await self._refusals.wait_for(lambda: self.refused >= count)

    async def _handle(self, ws: ServerConnection) -> None:
        conn = EdgeConn(ws, next(self._generations))
        self.all.append(conn)
        try:
            register = wire.decode_from_node(await ws.recv())
            conn.received.append(register)
            if not isinstance(register, wire.Register):
                await ws.close(wire.CLOSE_PROTOCOL_ERROR, "expected register")
                return
            await conn.send(
                wire.RegisterResponse(
                    generation=conn.generation,
                    payload=self.payload,
                    heartbeat_interval_s=self.heartbeat_interval_s,
                    heartbeat_timeout_s=self.heartbeat_timeout_s,
                )
            )
            async for frame in ws:
                await self._dispatch(conn, wire.decode_from_node(frame))
        except ConnectionClosed:
            pass
        finally:
            conn.close_code = ws.close_code
            conn.closed.set()

    async def _dispatch(self, conn: EdgeConn, message: wire.NodeToEdge) -> None:
        conn.received.append(message)
        if isinstance(message, wire.RunEvent):
            log = conn.run(message.run_id)
            log.data.append(message.data)
            log.started.set()
        elif isinstance(message, wire.RunEnd):
            log = conn.run(message.run_id)
            if message.data:  # its last output, as the Edge reads it (hub._handle)
                log.data.append(message.data)
                log.started.set()
            log.ends.append(message)
            log.done.set()
        else:
            if isinstance(message, wire.Ping) and self.answer_pings:
                await conn.send(wire.Pong(ts=message.ts))
            if isinstance(message, wire.Ready) and not conn.ready.is_set():
                conn.ready.set()
                self.connections.put_nowait(conn)
            conn.inbox.put_nowait(message)
