"""The Edge's side of the Node wire: sessions, generations, readiness and runs (no Django).

One ``NodeSession`` per websocket connection. A session is *pending* until its Node
has applied the register payload and sent ``ready``; only then is it dispatch-ready
(R-NODE-1): its providers become pool candidates, it receives refresh pushes, and
the pool re-evaluates its waiters. The newest connection of a node wins.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from catalog.config import EdgeSnapshot
from nodes import wire
from nodes.payload import compile_payload
from nodes.refusals import MAX_REASON_CHARS, refusals
from nodes.runs import NodeUnavailable, RunChannel, RunOrder
from nodes.tokens import sane_usage
from obskit.logs import printable
from pool.engine import Lease, PoolEngine

if TYPE_CHECKING:
    from nodes.remote import RunRouter

__all__ = ["NodeHub", "NodeSession", "NodeUnavailable", "Transport"]

log = logging.getLogger("iop.nodes")

PENDING, READY, CLOSED = "pending", "ready", "closed"
MAX_PROBE_REASON_CHARS = 200  # a Node's probe reason is shown in /pool: bound it


class Transport(Protocol):
    async def send(self, frame: bytes) -> None: ...
    async def close(self, code: int) -> None: ...


class NodeSession:
    __slots__ = ("generation", "last_seen", "node_id", "protocol", "revision", "runs", "state",
                 "transport")  # fmt: skip

    def __init__(self, node_id: str, generation: int, transport: Transport, now: float) -> None:
        self.node_id = node_id
        self.generation = generation
        self.transport = transport
        self.state = PENDING
        self.revision = ""
        self.protocol = wire.PROTOCOL_VERSION  # the Node's, from its register (R-HA-4)
        self.runs: dict[str, RunChannel] = {}
        self.last_seen = now


class NodeHub:
    """Owns every Node connection; the pool learns readiness only from here."""

    def __init__(
        self,
        snapshot: Callable[[], EdgeSnapshot],
        pool: PoolEngine,
        *,
        heartbeat_interval_s: float = 15.0,
        heartbeat_timeout_s: float = 45.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._snapshot = snapshot
        self._pool = pool
        self._clock = clock
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.sessions: dict[str, NodeSession] = {}
        self._generations = itertools.count(1)
        self._run_ids = itertools.count(1)
        # Ids derived from run ids (chatcmpl-...) stay unique across restarts: a random
        # prefix per Edge process (docs/http-api.md).
        self._boot = secrets.token_hex(4)
        self._tasks: set[asyncio.Task[None]] = set()
        self.open_channels: set[RunChannel] = set()  # opened and not yet closed by the request
        self._heartbeat: asyncio.Task[None] | None = None
        # Scale-out: runs for Nodes connected to another Edge go there (R-SCALE-2).
        self.remote: RunRouter | None = None

    # --- connections -------------------------------------------------------------------------

    def authenticate(self, node_id: str, token: str) -> bool:
        """Constant-time check of a node token against the configured sha256 (before accept)."""
        node = self._snapshot().node(node_id)
        digest = hashlib.sha256(token.encode()).hexdigest()
        expected = node.token_hash_sha256 if node is not None else "0" * 64
        matches = hmac.compare_digest(digest, expected)
        if node is None:
            log.warning(
                "node %r refused: it is not in the running revision (a node added to the "
                "catalog runs after its staged revision and a restart, docs/journeys.md)",
                node_id[:100],
            )
        elif not matches:
            log.warning(
                "node %s refused: its token does not match the running revision's "
                "token_hash_sha256 (after a rotation the Node needs the new node.token)",
                node_id,
            )
        return matches and node is not None

    async def connect(self, node_id: str, transport: Transport) -> NodeSession:
        """A new accepted connection: it supersedes any older one of the same node."""
        session = NodeSession(node_id, next(self._generations), transport, self._clock())
        old = self.sessions.get(node_id)
        self.sessions[node_id] = session
        if old is not None:
            log.info(
                "node %s: generation %s superseded by %s",
                node_id,
                old.generation,
                session.generation,
            )
            await self._end_session(old, "node connection superseded by a newer one")
            self._spawn(old.transport.close(wire.CLOSE_SUPERSEDED))
        self._ensure_heartbeat()
        return session

    async def disconnect(self, session: NodeSession) -> None:
        await self._end_session(session, "node disconnected")
        if self.sessions.get(session.node_id) is session:
            del self.sessions[session.node_id]

    async def _end_session(self, session: NodeSession, reason: str) -> None:
        if session.state == CLOSED:
            return
        was_ready = session.state == READY
        session.state = CLOSED
        runs = list(session.runs.values())
        session.runs.clear()
        for channel in runs:
            channel.fail("node_gone", reason)
        if was_ready:
            self._pool.node_gone(session.node_id, session.generation)

    # --- frames from a Node -----------------------------------------------------------------

    async def receive(self, session: NodeSession, frame: bytes | str) -> None:
        session.last_seen = self._clock()
        try:
            message = wire.decode_from_node(frame)
            await self._handle(session, message)
        except wire.WireError as exc:
            await self.refuse(session, "protocol_error", f"malformed message: {exc}")

    async def refuse(self, session: NodeSession, code: str, message: str) -> None:
        """Tell the Node why, then close this connection only."""
        log.warning("node %s generation %s: %s", session.node_id, session.generation, message)
        await self._end_session(session, message)
        if self.sessions.get(session.node_id) is session:
            del self.sessions[session.node_id]
        await session.transport.send(wire.encode(wire.ErrorMessage(code=code, message=message)))
        await session.transport.close(wire.CLOSE_PROTOCOL_ERROR)

    async def _handle(self, session: NodeSession, message: wire.NodeToEdge) -> None:
        if session.state == CLOSED:
            return
        if isinstance(message, wire.RunEvent):
            self._feed(session, message.run_id, message.data)
        elif isinstance(message, wire.RunEnd):
            data, message.data = message.data, ""  # its last output goes first, as an event
            if data and not self._feed(session, message.run_id, data):
                return
            channel = session.runs.pop(message.run_id, None)
            if channel is not None:
                message.usage = sane_usage(message.usage, f"node {session.node_id}")  # R-IN-6
                channel.finish(message)
        elif isinstance(message, wire.ProbeResult):
            if session.state == READY:  # only for this node's own providers (R-HEALTH-3)
                reason = message.reason[:MAX_PROBE_REASON_CHARS]
                self._pool.probed(session.node_id, message.provider_id, message.ok, reason)
        elif isinstance(message, wire.Register):
            await self._on_register(session, message)
        elif isinstance(message, wire.Ready):
            await self._on_ready(session, message)
        elif isinstance(message, wire.Ping):
            await session.transport.send(wire.encode(wire.Pong(ts=message.ts)))
        elif isinstance(message, wire.ConfigRefreshAck):
            self._on_refresh_ack(session, message)
        # Pong only refreshes last_seen.

    def _feed(self, session: NodeSession, run_id: str, data: str) -> bool:
        """Queue a run's output; False when it overran its credit (the run is failed and
        cancelled on the Node). Output of a run no longer here is dropped."""
        channel = session.runs.get(run_id)
        if channel is None or channel.feed(data):
            return True
        log.warning(
            "node %s: run %s overran its credit", session.node_id, channel.run_id,
            extra=channel.log_context(),
        )  # fmt: skip
        del session.runs[channel.run_id]
        channel.fail("upstream_error", "the node sent more output than it was allowed")
        self._spawn(session.transport.send(wire.encode(wire.Cancel(run_id=channel.run_id))))
        return False

    def _on_refresh_ack(self, session: NodeSession, message: wire.ConfigRefreshAck) -> None:
        if session.state == READY:
            refused = self._refusals(session.node_id, message.unavailable)
            self._pool.node_refused(session.node_id, session.generation, refused)
        if not message.ok:
            # The Node kept a payload it could not fully build: the next apply pushes again,
            # even an unchanged one, so fixing the Node's environment and re-applying works.
            if message.revision == session.revision:
                session.revision = f"refused:{message.revision}"
            log.warning(
                "node %s refused refresh %s: %s",
                session.node_id,
                printable(message.revision, 100),  # the Node's text (R-TLS-9)
                printable(message.error or "", MAX_REASON_CHARS),
            )

    def _refusals(self, node_id: str, unavailable: dict[str, str]) -> dict[str, str]:
        node = self._snapshot().node(node_id)
        return refusals(node_id, unavailable, {p.id for p in node.providers} if node else set())

    async def _on_register(self, session: NodeSession, message: wire.Register) -> None:
        if message.node_id != session.node_id:
            await self.refuse(session, "bad_register", "register does not match the node")
            return
        if message.protocol not in wire.ACCEPTED_PROTOCOLS:  # R-HA-4: one line, both versions
            speaks = "-".join(str(v) for v in (min(wire.ACCEPTED_PROTOCOLS), wire.PROTOCOL_VERSION))
            await self.refuse(
                session,
                "unsupported_protocol",
                f"this Edge speaks wire protocol {speaks}, the Node (agent "
                f"{message.agent_version or 'unknown'}) protocol {message.protocol}: upgrade "
                "the older of the two (docs/scale-out.md, rolling upgrades)",
            )
            return
        session.protocol = message.protocol
        if session.state != PENDING or session.revision:
            await self.refuse(session, "protocol_error", "register sent twice")
            return
        payload = compile_payload(self._snapshot(), session.node_id)
        session.revision = payload.revision
        await session.transport.send(
            wire.encode(
                wire.RegisterResponse(
                    generation=session.generation,
                    payload=payload,
                    heartbeat_interval_s=self.heartbeat_interval_s,
                    heartbeat_timeout_s=self.heartbeat_timeout_s,
                )
            )
        )

    async def _on_ready(self, session: NodeSession, message: wire.Ready) -> None:
        if (
            session.state != PENDING
            or not session.revision
            or message.generation != session.generation
        ):
            await self.refuse(session, "protocol_error", "ready without a matching register")
            return
        session.state = READY
        log.info("node %s generation %s ready", session.node_id, session.generation)
        # A refresh applied while this Node was pending reaches it now (R-NODE-4).
        await self._push_if_changed(session)
        refused = self._refusals(session.node_id, message.unavailable)
        self._pool.node_ready(session.node_id, session.generation, refused)

    # --- runs --------------------------------------------------------------------------------

    async def open_run(self, lease: Lease, spec: RunOrder, window: int = 0) -> RunChannel:
        """Send a run to the lease's Node; its output arrives on the returned channel.

        ``window`` > 0: the Node holds its output once that many characters are not yet
        relayed (R-IN-5). A body over ``wire.SPLIT_BODY_BYTES`` goes first in parts (R-IN-2).
        A Node connected to another Edge is reached through ``remote`` (R-SCALE-2).
        """
        run_id = f"r{self._boot}{next(self._run_ids):x}"
        session = self.sessions.get(lease.node_id)
        if (session is None or session.state != READY) and self.remote is not None:
            channel = await self.remote.open_run(
                run_id, lease.node_id, lease.provider_id, spec, window
            )
        else:
            channel = await self.open_local(run_id, lease.node_id, lease.provider_id, spec, window)
        self.open_channels.add(channel)
        return channel

    async def open_local(
        self, run_id: str, node_id: str, provider_id: str, spec: RunOrder, window: int
    ) -> RunChannel:
        """Send a run to a Node connected here; raises ``NodeUnavailable`` when it is not."""
        session = self.sessions.get(node_id)
        if session is None or session.state != READY:
            raise NodeUnavailable(node_id)
        # Managed mode: sealed before the run exists, so a refusal leaves nothing behind.
        envelope = None if spec.seal is None else spec.seal(run_id, node_id, session.generation)
        transport = session.transport

        def grant(chars: int) -> None:
            self._spawn(transport.send(wire.encode(wire.Credit(run_id=run_id, chars=chars))))

        channel = RunChannel(
            run_id, node_id, window, grant if window else None, request_id=spec.request_id
        )
        session.runs[run_id] = channel
        parts = wire.split(spec.body.decode()) if len(spec.body) > wire.SPLIT_BODY_BYTES else []
        fields: dict[str, Any] = {
            "run_id": run_id,
            "provider_id": provider_id,
            "operation": spec.operation,
            "stream": spec.stream,
            "body": msgspec.Raw(b"null" if parts else spec.body),
            "body_parts": len(parts),
            "credit": window,
            "lease_envelope": envelope,
            "request_id": spec.request_id,
            "traceparent": spec.traceparent,
        }
        message: wire.TunnelRequest | wire.RunRequest = (  # R-POOL-10: passthrough or normalized
            wire.TunnelRequest(**fields, forward_headers=dict(spec.forward_headers))
            if spec.tunnel
            else wire.RunRequest(**fields)
        )
        try:
            for part in parts:
                await transport.send(wire.encode(wire.RunBodyPart(run_id=run_id, data=part)))
            await transport.send(wire.encode(wire.for_protocol(message, session.protocol)))
        except BaseException:
            self.close_run(channel)
            raise
        return channel

    def relay_buffered(self) -> tuple[int, int, int]:
        """Run output received and not yet relayed (R-IN-5): total and largest characters,
        and how many runs wait for their client to read."""
        sizes = [channel.outstanding for channel in self.open_channels]
        held = sum(1 for channel in self.open_channels if channel.held)
        return sum(sizes), max(sizes, default=0), held

    def close_run(self, channel: RunChannel) -> None:
        """The request is done with this run; a run still going is cancelled on its Node."""
        self.open_channels.discard(channel)
        if channel.finished:
            return
        channel.fail("cancelled", "the caller went away")
        if self.remote is not None and self.remote.cancel(channel):
            return
        session = self.sessions.get(channel.node_id)
        if session is not None and session.runs.pop(channel.run_id, None) is not None:
            self._spawn(session.transport.send(wire.encode(wire.Cancel(run_id=channel.run_id))))

    # --- refresh -----------------------------------------------------------------------------

    async def push_refresh(self) -> list[str]:
        """Push the new payload to every dispatch-ready Node whose payload changed (R-NODE-4)."""
        pushed = []
        for session in list(self.sessions.values()):
            if session.state == READY and await self._push_if_changed(session):
                pushed.append(session.node_id)
        return sorted(pushed)

    async def _push_if_changed(self, session: NodeSession) -> bool:
        payload = compile_payload(self._snapshot(), session.node_id)
        if payload.revision == session.revision:
            return False
        try:
            await session.transport.send(wire.encode(wire.ConfigRefresh(payload=payload)))
        except Exception as exc:  # a closing connection: the Node gets the payload at ready
            log.warning("node %s: config refresh not sent (%s)", session.node_id, exc)
            return False
        session.revision = payload.revision
        return True

    # --- liveness ----------------------------------------------------------------------------

    def _ensure_heartbeat(self) -> None:
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.get_running_loop().create_task(self._heartbeat_loop())

    async def _heartbeat_loop(self) -> None:
        while self.sessions:
            await asyncio.sleep(self.heartbeat_interval_s)
            now = self._clock()
            for session in list(self.sessions.values()):
                if now - session.last_seen > self.heartbeat_timeout_s:
                    log.warning(
                        "node %s: no frame for %.0f s, declaring it gone",
                        session.node_id,
                        now - session.last_seen,
                    )
                    await self.disconnect(session)
                    self._spawn(session.transport.close(wire.CLOSE_HEARTBEAT_TIMEOUT))
                elif session.revision:  # a pending session's first frame is register_response
                    self._spawn(session.transport.send(wire.encode(wire.Ping(ts=now))))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Future[None]) -> None:
        self._tasks.discard(task)  # type: ignore[arg-type]
        if not task.cancelled() and task.exception() is not None:
            log.debug("node frame not delivered: %s", type(task.exception()).__name__)

    async def aclose(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        for session in list(self.sessions.values()):
            await self.disconnect(session)
            self._spawn(session.transport.close(wire.CLOSE_SHUTDOWN))
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2)
