"""Runs between Edges over Redis streams (R-SCALE-2; docs/scale-out.md, "Run routing").

A run leased on one Edge (the *requester*) whose Node is connected to another (the *owner*,
named by ``{P}:node:{node_id}`` fields ``edge`` and ``fence``) travels as messages on two
streams per Edge process: ``{P}:edge:{id}:{fence}:runs`` (orders, body parts, credit and
cancels, read by the owner) and ``{P}:edge:{id}:{fence}:replies`` (output and the end, read by
the requester). One reader task per process blocks on both. The requester reads an ordinary
``RunChannel``; the owner runs the order on its local session (``nodes.remote_owner``) without
touching its pool (the lease stays the requester's). Flow is bounded end to end: the owner
relays at most ``window`` characters (``REMOTE_WINDOW_CHARS`` when the run has none) not yet
credited back by the requester, and asks the Node for no more than that (R-IN-5).

A process is (id, fence) (R-SCALE-4): a peer is alive while ``{P}:alive:{id}`` holds its
fence. A dead one (its key gone, or the id taken over by a newer process) has its runs failed
with ``node_gone`` (requester side) or cancelled on the Node (owner side) within
``ttl_s + check_s``; an order of a process that is not alive is refused. A failed read, or
Redis silent for ``lost_after_s``: every routed run ends with ``relay_unavailable``. No Django
here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from nodes import wire
from nodes.remote_owner import Issuer, LocalRuns, ServedRuns
from nodes.remote_wire import (
    Cancel,
    Credit,
    End,
    Msg,
    Open,
    Output,
    Part,
    entry,
    read_entry,
)
from nodes.runs import NodeUnavailable, RunChannel, RunOrder
from nodes.tokens import sane_usage
from pool.engine_redis import connect

log = logging.getLogger("iop.nodes.remote")

REMOTE_WINDOW_CHARS = 1024 * 1024  # unacknowledged output in flight when a run has no window
STREAM_MAXLEN = 100_000  # entries kept per stream (approximate trim): a bound, never reached
STREAM_TTL_S = 120.0  # a dead Edge's streams vanish this long after the last message
READ_BLOCK_MS = 1000
READ_COUNT = 200
NO_FENCE = "1"  # the fence of a router given none (no pool engine: the tests' own alive keys)


class RelayUnavailable(NodeUnavailable):
    """Redis cannot be reached to route a run to another Edge."""

    code = "pool_unavailable"  # the same answer as an admission while Redis is away
    public_message = "the shared pool's store cannot be reached"


@dataclass(eq=False)
class _Requested:
    channel: RunChannel
    owner: str
    owner_fence: str
    sent_at: float  # monotonic: an order nobody took within ``ttl_s`` fails (retryable)
    taken: bool = False


class RunRouter:
    """Routes runs to the Edge whose Node holds them, and serves runs routed here."""

    def __init__(
        self,
        redis: str | aioredis.Redis,
        *,
        prefix: str,
        edge_id: str,
        local: LocalRuns,
        ttl_s: float = 10.0,
        read_block_ms: int = READ_BLOCK_MS,
        fence: Callable[[], str | None] | None = None,
    ) -> None:
        self._own_client = isinstance(redis, str)
        # The reader has its own connection: a blocked XREAD is never cancelled (redis-py
        # cannot cancel one cleanly); it is told to stop and ends within ``read_block_ms``.
        read_timeout = read_block_ms / 1000 + ttl_s
        if isinstance(redis, str):  # a plain server or a Sentinel-managed primary (R-HA-1)
            store = connect.parse(redis)
            self._redis = store.client(socket_connect_timeout=2, socket_timeout=ttl_s)
            self._reader = store.client(socket_connect_timeout=2, socket_timeout=read_timeout)
        else:
            self._redis = redis
            kwargs = dict(redis.connection_pool.connection_kwargs)
            kwargs["socket_timeout"] = read_timeout
            self._reader = aioredis.Redis.from_pool(  # owns its pool: closed with it
                aioredis.ConnectionPool(
                    connection_class=redis.connection_pool.connection_class, **kwargs
                )
            )
        self.read_block_ms = read_block_ms
        self.prefix, self.edge_id, self.ttl_s = prefix, edge_id, ttl_s
        self.check_s = max(ttl_s / 3, 0.05)
        # An idle blocked XREAD answers every read_block_ms: silence past this is a lost Redis.
        self.lost_after_s = ttl_s + read_block_ms / 1000
        self._stopping = False
        self._fence_of = fence  # read at start: the pool engine claims the id first
        self.fence = NO_FENCE
        self._requested: dict[str, _Requested] = {}
        self._owner = ServedRuns(local, self._send, self._spawn, self._alive)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._last_ok = time.monotonic()
        self._owner_of = self._redis.register_script(_OWNER_OF)

    @property
    def issuer(self) -> Issuer | None:
        """Managed mode: issues envelopes for runs routed to this Edge's Nodes (R-SCALE-7)."""
        return self._owner.issuer

    @issuer.setter
    def issuer(self, issuer: Issuer | None) -> None:
        self._owner.issuer = issuer

    def held_back(self) -> int:
        """Runs served here whose output waits for their requester's credit (R-IN-5)."""
        return self._owner.held_back()

    def _key(self, edge_id: str, fence: str, kind: str) -> str:
        return f"{self.prefix}:edge:{edge_id}:{fence}:{kind}"

    async def start(self) -> None:
        """Read from the current end of this process's streams (what is there is stale)."""
        if self._fence_of is not None:
            self.fence = self._fence_of() or NO_FENCE
        ids: list[Any] = []
        for kind in ("runs", "replies"):
            last = await self._redis.xrevrange(self._key(self.edge_id, self.fence, kind), count=1)
            ids.append(last[0][0] if last else "0-0")
        self._last_ok = time.monotonic()
        loop = asyncio.get_running_loop()
        self._loops = [loop.create_task(self._read(*ids)), loop.create_task(self._watch())]

    async def aclose(self) -> None:
        self._stopping = True
        if self._loops:
            reader, watcher = self._loops
            watcher.cancel()
            await asyncio.wait(self._loops, timeout=self.read_block_ms / 1000 + 1)
            reader.cancel()  # only if Redis kept it past its block
        self._fail_all("node_shutdown", "this Edge is shutting down")
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2)
        await self._reader.aclose()
        if self._own_client:
            await self._redis.aclose()

    # --- requester side ----------------------------------------------------------------------

    async def open_run(
        self, run_id: str, node_id: str, provider_id: str, spec: RunOrder, window: int
    ) -> RunChannel:
        """Send the run to its Node's Edge; raises ``NodeUnavailable`` when no live Edge
        holds the Node (``RelayUnavailable`` when Redis cannot be reached)."""
        if spec.seal is not None and spec.grant is None:
            raise NodeUnavailable(f"{node_id}: a managed-mode run needs its slot grant to route")
        try:
            found = await self._owner_of(
                keys=[f"{self.prefix}:node:{node_id}"], args=[f"{self.prefix}:alive:"]
            )
        except RedisError as exc:
            raise RelayUnavailable(f"{node_id}: Redis unreachable ({type(exc).__name__})") from None
        if not found or _text(found[0]) == self.edge_id:
            raise NodeUnavailable(node_id)
        owner, owner_fence = str(_text(found[0])), str(_text(found[1]))
        window = window or REMOTE_WINDOW_CHARS
        body = spec.body.decode()
        parts = wire.split(body) if len(body) > wire.SPLIT_BODY_BYTES else []
        order = Open(
            run_id=run_id,
            reply_to=self.edge_id,
            fence=self.fence,
            node_id=node_id,
            provider_id=provider_id,
            operation=spec.operation,
            stream=spec.stream,
            tunnel=spec.tunnel,
            window=window,
            body="" if parts else body,
            body_parts=len(parts),
            forward_headers=dict(spec.forward_headers) if spec.tunnel else {},
            request_id=spec.request_id,
            traceparent=spec.traceparent,
            grant=spec.grant,  # the Edge holding the Node issues the envelope (R-SCALE-7)
        )
        messages: list[Msg] = [
            Part(run_id=run_id, reply_to=self.edge_id, fence=self.fence, data=p) for p in parts
        ]
        to = (owner, owner_fence)

        def grant(chars: int) -> None:
            self._spawn(self._send(to, "runs", Credit(run_id, self.edge_id, self.fence, chars)))

        channel = RunChannel(run_id, node_id, window, grant, request_id=spec.request_id)
        self._requested[run_id] = _Requested(channel, owner, owner_fence, time.monotonic())
        try:
            await self._send(to, "runs", *messages, order)
        except RedisError as exc:
            # The read loop may have failed every run already (the same outage): pop, not del.
            self._requested.pop(run_id, None)
            raise RelayUnavailable(f"{node_id}: Redis unreachable ({type(exc).__name__})") from None
        except BaseException:
            self._requested.pop(run_id, None)
            self._spawn(self._send(to, "runs", Cancel(run_id, self.edge_id, self.fence)))
            raise
        return channel

    def cancel(self, channel: RunChannel) -> bool:
        """The request is done with a routed run: cancel it on the owner. False when the
        channel is not a routed one."""
        requested = self._requested.get(channel.run_id)
        if requested is None or requested.channel is not channel:
            return False
        del self._requested[channel.run_id]
        to = (requested.owner, requested.owner_fence)
        self._spawn(self._send(to, "runs", Cancel(channel.run_id, self.edge_id, self.fence)))
        return True

    def _on_reply(self, message: Msg) -> None:
        requested = self._requested.get(message.run_id)
        if requested is None:
            return  # a run already closed here
        channel = requested.channel
        requested.taken = True  # any reply means the owner has the order
        if isinstance(message, Output):
            if not channel.feed(message.data):
                log.warning(
                    "run %s: Edge %s overran its credit", message.run_id, requested.owner,
                    extra=channel.log_context(),
                )  # fmt: skip
                self.cancel(channel)
                channel.fail("upstream_error", "the node's Edge sent more output than allowed")
        elif isinstance(message, End):
            del self._requested[message.run_id]
            usage = sane_usage(message.usage, f"Edge {requested.owner}")  # R-IN-6
            channel.finish(wire.RunEnd(message.run_id, message.ok, message.error, usage))

    # --- Redis -------------------------------------------------------------------------------

    async def _send(self, to: tuple[str, str], kind: str, *messages: Msg) -> None:
        key = self._key(*to, kind)
        async with self._redis.pipeline(transaction=False) as pipe:
            for message in messages:
                pipe.xadd(key, entry(message), maxlen=STREAM_MAXLEN, approximate=True)
            pipe.pexpire(key, int(STREAM_TTL_S * 1000))
            await pipe.execute()

    async def _read(self, runs_id: Any, replies_id: Any) -> None:
        orders = self._key(self.edge_id, self.fence, "runs")
        replies = self._key(self.edge_id, self.fence, "replies")
        streams: dict[Any, Any] = {orders: runs_id, replies: replies_id}
        while not self._stopping:
            try:
                reply: Any = await self._reader.xread(
                    streams, count=READ_COUNT, block=self.read_block_ms
                )
            except RedisError as exc:
                log.warning("run routing: cannot read from Redis (%s)", type(exc).__name__)
                # A message sent to or by this Edge meanwhile may be lost (a failed XADD is not
                # sent again; a restarted Redis lost the streams): no run may wait for it.
                self._fail_all("relay_unavailable", "run routing between Edges lost Redis")
                await asyncio.sleep(min(1.0, self.check_s))
                continue
            self._last_ok = time.monotonic()
            for name, entries in reply:
                name = name.decode() if isinstance(name, bytes) else name
                for entry_id, fields in entries:
                    streams[name] = entry_id
                    try:
                        message = read_entry(fields)
                    except (msgspec.ValidationError, msgspec.DecodeError, KeyError):
                        log.warning("run routing: malformed message on %s ignored", name)
                        continue
                    if name == orders:
                        self._owner.order(message)
                    else:
                        self._on_reply(message)

    async def _watch(self) -> None:
        """Fail runs of dead peers, orders nobody took, and every run when Redis stays
        unreachable."""
        while True:
            await asyncio.sleep(self.check_s)
            if time.monotonic() - self._last_ok > self.lost_after_s and not await self._answers():
                self._fail_all("relay_unavailable", "run routing between Edges lost Redis")
                continue
            self._fail_untaken()
            peers = self._peers()
            if not peers:
                continue
            names = sorted({edge for edge, _ in peers})
            try:
                found = await self._redis.mget([f"{self.prefix}:alive:{p}" for p in names])
            except RedisError:
                continue  # the read loop's clock decides when Redis is gone
            holds = {name: _text(v) for name, v in zip(names, found, strict=True)}
            # Dead: the alive key is gone, or names another process of that id (R-SCALE-4).
            dead = {peer for peer in peers if holds[peer[0]] != peer[1]}
            self._drop(dead, "node_gone", "the Edge holding the node stopped answering")

    def _fail_untaken(self) -> None:
        """An owner alive but not reading its orders: nothing ran, another provider may."""
        late = time.monotonic() - self.ttl_s
        for run_id, requested in list(self._requested.items()):
            if not requested.taken and requested.sent_at < late:
                self.cancel(requested.channel)  # in case it is read after all
                error = wire.RunError(
                    code="node_gone",
                    message="the Edge holding the node did not take the run",
                    retryable=True,
                    phase=wire.PHASE_CONNECT,
                )
                requested.channel.finish(wire.RunEnd(run_id, False, error))

    async def _answers(self) -> bool:
        """Whether Redis answers now: a late reader (a paused process, a slow loop) is not a
        lost Redis."""
        try:
            async with asyncio.timeout(self.check_s):
                await self._redis.ping()
        except (RedisError, TimeoutError):
            return False
        return True

    async def _alive(self, peer: tuple[str, str]) -> bool:
        """Whether the process ``peer`` (id, fence) holds its id (R-SCALE-4)."""
        return _text(await self._redis.get(f"{self.prefix}:alive:{peer[0]}")) == peer[1]

    def _peers(self) -> set[tuple[str, str]]:
        """The processes (id, fence) this one has routed runs with."""
        return {(r.owner, r.owner_fence) for r in self._requested.values()} | (
            self._owner.requesters()
        )

    def _drop(self, dead: set[tuple[str, str]], code: str, message: str) -> None:
        for run_id, requested in list(self._requested.items()):
            if (requested.owner, requested.owner_fence) in dead:
                del self._requested[run_id]
                requested.channel.fail(code, message)
        self._owner.drop(dead, message)

    def _fail_all(self, code: str, message: str) -> None:
        self._drop(self._peers(), code, message)

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("run routing message not delivered: %s", type(task.exception()).__name__)


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


# The process (Edge id, fence) holding a Node, while its id's alive key holds that fence (the
# process is alive and its id was not taken over, R-SCALE-4): one round trip at open.
_OWNER_OF = """
local v = redis.call('HMGET', KEYS[1], 'edge', 'fence')
if v[1] and v[2] and redis.call('GET', ARGV[1] .. v[1]) == v[2] then return {v[1], v[2]} end
return false
"""
