"""The connection loop: dial the Edge, register, become ready, serve, reconnect.

One connection at a time. Every message type comes from nodes.wire. The wire has its
own ping/pong, so the websocket library's pings are off; any frame from the Edge
counts as liveness, and silence longer than heartbeat_timeout_s drops the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import (
    ConnectionClosed,
    InvalidHandshake,
    InvalidMessage,
    InvalidStatus,
)
from websockets.typing import Subprotocol

from nodes import wire
from nodes.agent import __version__
from nodes.agent.config import NodeConfig
from nodes.agent.credentials import LeaseCredentials, load_opener
from nodes.agent.outbox import SendMessage
from nodes.agent.registry import Registries
from nodes.agent.router import Router
from nodes.agent.secrets import SecretError, resolve_secret
from nodes.agent.tracing import RunTracer
from nodes.agent.watchdog import Watchdog
from obskit.logs import printable

if TYPE_CHECKING:
    from obskit.otel import Tracing

log = logging.getLogger("iop_node.client")


class _RedactAuthorization(logging.Filter):
    """websockets logs request headers at DEBUG; the bearer token must never reach a log."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if (
            isinstance(args, tuple)
            and len(args) == 2
            and str(args[0]).lower()
            in (
                "authorization",
                wire.NODE_ID_HEADER,
            )
        ):
            record.args = (args[0], "<redacted>")
        return True


_ws_log = logging.getLogger("iop_node.websocket")
_ws_log.addFilter(_RedactAuthorization())
_ws_log.setLevel(logging.INFO)  # frame dumps may carry forwarded caller credentials


class Backoff:
    """Exponential delays with jitter in [d/2, d], capped."""

    def __init__(
        self,
        initial: float = 0.5,
        cap: float = 30.0,
        factor: float = 2.0,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.initial, self.cap, self.factor, self._rng = initial, cap, factor, rng
        self.attempt = 0

    def next(self) -> float:
        delay = min(self.cap, self.initial * self.factor**self.attempt)
        self.attempt += 1
        return delay * (0.5 + 0.5 * self._rng())

    def reset(self) -> None:
        self.attempt = 0


def _safe_url(url: str) -> str:
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}{parts.path}"


class NodeClient:
    """Runs the Node until ``stop()``: reconnecting, and draining runs on the way out."""

    def __init__(
        self,
        config: NodeConfig,
        *,
        shutdown_grace_s: float = 10.0,
        backoff: Backoff | None = None,
        open_timeout_s: float = 10.0,
        close_timeout_s: float = 5.0,
        tracing: Tracing | None = None,
    ) -> None:
        self.config = config
        self.tracer = RunTracer(config.node_id, tracing)  # R-OBS-1, R-OBS-2
        self.shutdown_grace_s = shutdown_grace_s
        self.open_timeout_s = open_timeout_s
        self.close_timeout_s = close_timeout_s
        self.backoff = backoff or Backoff()
        self.registries = Registries(config.policy, config.limits)
        # Managed mode (R-MGD-4): keys loaded at start; the replay cache outlives connections.
        plane = config.credential_plane
        self.credentials = LeaseCredentials(
            load_opener(plane) if plane is not None else None, config.node_id
        )
        self.generation: int | None = None
        self.router: Router | None = None
        self._serving = False
        self._ready_seen = False  # the current attempt reached ready
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Begin a graceful stop (SIGTERM/SIGINT): new runs are refused from now on."""
        self._stopping.set()
        if self.router is not None:
            self.router.accepting = False

    async def run(self) -> None:
        urls = self.config.urls
        index = tried = 0  # tried: attempts since the Node was last ready
        try:
            while not self._stopping.is_set():
                self._ready_seen = False
                await self._attempt(urls[index])
                if self._stopping.is_set():
                    break
                # Several Edges (docs/node.md): on losing one, the next at once; the backoff
                # only after a whole round of them failed.
                index = (index + 1) % len(urls)
                tried = 1 if self._ready_seen else tried + 1
                if tried < len(urls):
                    continue
                tried = 0
                delay = self.backoff.next()
                log.info("reconnecting in %.1fs", delay)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._stopping.wait()
        finally:
            await self.registries.aclose()
        log.info("stopped")

    async def _attempt(self, url: str) -> None:
        session = asyncio.create_task(self._connect_once(url), name="node-session")
        stop_wait = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({session, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if not session.done() and not self._serving:
                session.cancel()  # stopping before ready: nothing to drain
            await asyncio.gather(session, return_exceptions=True)
            if not session.cancelled() and session.exception() is not None:
                log.error("session failed: %r", session.exception())
        finally:
            stop_wait.cancel()

    async def _connect_once(self, url: str) -> None:
        try:
            token = resolve_secret(self.config.token.as_secret_ref(), what="token")
        except SecretError as exc:
            log.error("%s", exc)
            return
        log.info("connecting to %s as %s", _safe_url(url), self.config.node_id)
        try:
            async with connect(
                url,
                additional_headers={
                    "Authorization": f"Bearer {token}",
                    "X-IOP-Node-Id": self.config.node_id,
                },
                user_agent_header=f"iop-node/{__version__}",
                subprotocols=[Subprotocol(wire.WIRE_SUBPROTOCOL)],  # R-HA-4: chosen by an Edge of 3
                proxy=None,
                compression=None,
                max_size=wire.MAX_MESSAGE_BYTES,
                ping_interval=None,  # the wire has its own ping/pong
                open_timeout=self.open_timeout_s,
                close_timeout=self.close_timeout_s,
                logger=_ws_log,
                ssl=tls_context(self.config, url),
            ) as ws:
                await self._serve(ws)
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                log.error(
                    "the Edge refused node %s (HTTP %d): either the node is not in the Edge's "
                    "running revision (added or staged but the Edge not restarted yet) or the "
                    "token does not match (rotated?); the Edge's log names which "
                    "(docs/journeys.md)",
                    self.config.node_id,
                    status,
                )
            else:
                log.warning("the Edge answered the upgrade with HTTP %d", status)
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            tls_error = _tls_cause(exc)
            if tls_error is not None:  # R-TLS-2: one clear line, then the usual backoff
                log.error("TLS with %s failed: %s", _safe_url(url), _describe_tls(tls_error))
            elif url.startswith("wss://") and isinstance(exc, InvalidMessage):
                log.error("TLS with %s failed: %s", _safe_url(url), self._closed_in_handshake())
            else:
                log.warning("cannot connect to %s: %s", _safe_url(url), exc)
        except ConnectionClosed as exc:
            _log_close(exc)
        except wire.WireError as exc:
            log.error("invalid message from the Edge: %s", exc)
        finally:
            self._serving = False
            self.router = None

    def _closed_in_handshake(self) -> str:
        """TLS 1.3 servers refuse a client certificate after the handshake: the Node sees
        only a closed connection, so it says what the likely cause is."""
        tls = self.config.tls
        if tls is None or tls.cert_file is None:
            return (
                "the Edge closed the connection before answering; if it requires client "
                "certificates (mutual TLS), set tls.cert_file and tls.key_file"
            )
        return (
            "the Edge closed the connection before answering: it likely refused this "
            "node's client certificate (tls.cert_file must be signed by its client_ca_file)"
        )

    async def _serve(self, ws: ClientConnection) -> None:
        # R-HA-4: the protocol the Edge chose in the handshake (an Edge of 2 chose none)
        edge_protocol = wire.edge_protocol(ws.subprotocol)

        async def send(message: wire.NodeToEdge) -> None:
            message = wire.for_edge(message, edge_protocol)
            await ws.send(wire.encode(message))  # binary: no UTF-8 check per frame

        await send(
            wire.Register(
                node_id=self.config.node_id,
                protocol=edge_protocol,
                agent_version=__version__,
            )
        )
        async with asyncio.timeout(self.open_timeout_s):
            first = wire.decode_from_edge(await ws.recv())
            while isinstance(first, wire.Ping | wire.Pong):  # a heartbeat may come first
                if isinstance(first, wire.Ping):
                    await send(wire.Pong(ts=first.ts))
                first = wire.decode_from_edge(await ws.recv())
        if isinstance(first, wire.ErrorMessage):
            log.error(  # the Edge's text (R-TLS-9)
                "the Edge refused registration: %s: %s",
                printable(first.code, 64), printable(first.message),
            )  # fmt: skip
            return
        if not isinstance(first, wire.RegisterResponse):
            await ws.close(wire.CLOSE_PROTOCOL_ERROR, "expected register_response")
            return
        # R-NODE-1: apply the payload and install handlers before saying ready.
        registry = self.registries.install(first.payload)
        router = self.router = Router(
            self.registries,
            send,
            credentials=self.credentials,
            generation=first.generation,
            tracer=self.tracer,
        )
        router.prober.follow(registry)
        await send(
            wire.Ready(
                generation=first.generation,
                revision=first.payload.revision,
                unavailable=dict(registry.errors),
            )
        )
        self._serving = self._ready_seen = True
        self.generation = first.generation
        self.backoff.reset()
        log.info(
            "ready: generation %d, revision %s, %d providers",
            first.generation,
            printable(registry.revision, 100),
            len(registry.adapters),
        )
        reader = asyncio.create_task(self._read(ws, router, first.heartbeat_timeout_s))
        pinger = asyncio.create_task(self._ping(send, first.heartbeat_interval_s))
        stop_wait = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({reader, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if stop_wait.done() and not reader.done():
                log.info("stopping: %d runs in flight", len(router.runs))
                await router.shutdown(self.shutdown_grace_s)
                await ws.close(1001, "node shutting down")
            elif not reader.cancelled() and reader.exception() is not None:
                log.error("connection handler failed: %r", reader.exception())
        finally:
            for task in (reader, pinger, stop_wait):
                task.cancel()
            await asyncio.gather(reader, pinger, stop_wait, return_exceptions=True)
            await router.abort()  # the connection is gone: the Edge has failed these runs
            self.router = None

    async def _read(self, ws: ClientConnection, router: Router, timeout_s: float) -> None:
        dog = Watchdog()
        try:
            while True:
                dog.within(timeout_s)
                try:
                    frame = await ws.recv()
                except asyncio.CancelledError:
                    if not dog.took():
                        raise
                    log.warning("nothing from the Edge for %gs: reconnecting", timeout_s)
                    await ws.close(wire.CLOSE_HEARTBEAT_TIMEOUT, "heartbeat timeout")
                    return
                except ConnectionClosed as exc:
                    _log_close(exc)
                    return
                finally:
                    dog.clear()
                try:
                    message = wire.decode_from_edge(frame)
                except wire.WireError as exc:
                    log.error("invalid message from the Edge: %s", exc)
                    await ws.close(wire.CLOSE_PROTOCOL_ERROR, "invalid message")
                    return
                await router.handle(message)
        finally:
            dog.close()

    async def _ping(self, send: SendMessage, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            with contextlib.suppress(Exception):
                await send(wire.Ping(ts=time.time()))


def tls_context(config: NodeConfig, url: str | None = None) -> ssl.SSLContext | None:
    """For a wss:// ``url`` (default: the first Edge URL): verify the Edge against
    tls.ca_file (else the system store), TLS 1.2+, and present tls.cert_file when configured
    (R-TLS-2). None for ws://."""
    if not (url or config.urls[0]).startswith("wss://"):
        return None
    tls = config.tls
    context = ssl.create_default_context(cafile=tls.ca_file if tls else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls is not None and tls.cert_file and tls.key_file:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    return context


def _tls_cause(exc: BaseException) -> ssl.SSLError | None:
    """The TLS error behind a failed connection, however websockets wrapped it."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _describe_tls(error: ssl.SSLError) -> str:
    if isinstance(error, ssl.SSLCertVerificationError):
        return (
            f"the Edge's certificate was refused ({error.verify_message}): "
            "check tls.ca_file and the host name in edge_url"
        )
    reason = error.reason or str(error)
    if (
        "CERTIFICATE_REQUIRED" in reason
        or "CERTIFICATE_UNKNOWN" in reason
        or ("BAD_CERTIFICATE" in reason or "UNKNOWN_CA" in reason)
    ):
        return f"the Edge refused this node's client certificate ({reason}): check tls.cert_file"
    return reason


def _log_close(exc: ConnectionClosed) -> None:
    code = exc.rcvd.code if exc.rcvd is not None else None
    reason = exc.rcvd.reason if exc.rcvd is not None else ""
    if code == wire.CLOSE_UNAUTHORIZED:
        log.error("the Edge closed the connection: unauthorized (%s)", reason)
    elif code == wire.CLOSE_SUPERSEDED:
        log.warning("another connection with this node id replaced this one")
    elif code in (1000, 1001):
        log.info("the Edge closed the connection (%d %s)", code, reason)
    else:
        log.warning("connection lost (%s %s)", code, reason)
