"""The owner Edge's side of run routing (R-SCALE-2; docs/scale-out.md, "Run routing").

Runs another Edge process ordered here, for a Node connected to this Edge: each order runs on
the local session through ``LocalRuns`` without touching the pool (the lease stays the
requester's), and its output goes back within the requester's credit (R-IN-5). The router
(``nodes.remote.RunRouter``) reads the orders and carries the replies; no Django here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from redis.exceptions import RedisError

from nodes import wire
from nodes.envelope import SealRefused, SlotGrant
from nodes.remote_wire import Cancel, Credit, End, Msg, Open, Output, Part, Taken
from nodes.runs import NodeUnavailable, RunChannel, RunOrder
from obskit.context import MAX_REQUEST_ID_CHARS, REQUEST_ID, RUN_ID
from obskit.logs import printable

log = logging.getLogger("iop.nodes.remote")

MAX_RELAY_CHARS = 256 * 1024  # one output message carries at most this much
MAX_SERVED_RUNS = 10_000  # runs (or bodies still arriving) served here for other Edges
MAX_BODY_PARTS = wire.MAX_BODY_CHARS // wire.MAX_EVENT_DATA_CHARS  # R-IN-2's bound, in parts

Process = tuple[str, str]  # an Edge process: (id, fence), R-SCALE-4
# Managed mode (R-SCALE-7): (grant, provider id) -> the run's sealer on this (owner) Edge.
Issuer = Callable[[SlotGrant, str], Callable[[str, str, int], dict[str, Any]]]
Send = Callable[[Process, str, Msg], Awaitable[None]]  # to a process's "runs" or "replies"
Spawn = Callable[[Awaitable[Any]], "asyncio.Task[Any]"]
Alive = Callable[[Process], Awaitable[bool]]


class LocalRuns(Protocol):
    """The owner Edge's own sessions (``NodeHub``)."""

    async def open_local(
        self, run_id: str, node_id: str, provider_id: str, spec: RunOrder, window: int
    ) -> RunChannel: ...

    def close_run(self, channel: RunChannel) -> None: ...


@dataclass(frozen=True, slots=True)
class Served:
    """A run served here for another Edge process: (requester id, its fence, run id)."""

    edge: str
    fence: str
    run_id: str

    @property
    def requester(self) -> Process:
        return (self.edge, self.fence)


@dataclass(eq=False)
class _Served:
    parts: list[str] = field(default_factory=list)
    in_flight: int = 0  # characters sent to the requester and not yet credited
    credited: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: bool = False  # output held back until the requester credits more
    task: asyncio.Task[None] | None = None


class ServedRuns:
    """Runs served here for other Edge processes."""

    def __init__(self, local: LocalRuns, send: Send, spawn: Spawn, alive: Alive) -> None:
        self._local = local
        self._send = send
        self._spawn = spawn
        self._alive = alive
        self._served: dict[Served, _Served] = {}
        self.issuer: Issuer | None = None  # managed mode: issues envelopes (R-SCALE-7)

    def requesters(self) -> set[Process]:
        return {key.requester for key in self._served}

    def drop(self, dead: set[Process], message: str) -> None:
        """Cancel on their Nodes the runs of requesters that are gone."""
        for key, served in list(self._served.items()):
            if key.requester in dead:
                log.warning(  # ids from Redis: another Edge's text (R-TLS-9)
                    "run %s for Edge %s cancelled: %s",
                    printable(key.run_id, 64), printable(key.edge, 64), message,
                )  # fmt: skip
                self._stop(key, served)

    def held_back(self) -> int:
        """Runs served here whose output waits for their requester's credit (R-IN-5)."""
        return sum(1 for served in self._served.values() if served.waiting)

    def order(self, message: Msg) -> None:
        """One message of a requester's ``runs`` stream."""
        if not isinstance(message, Open | Part | Credit | Cancel):
            return
        key = Served(message.reply_to, message.fence, message.run_id)
        served = self._served.get(key)
        if isinstance(message, Part):
            if served is None:
                if len(self._served) >= MAX_SERVED_RUNS:
                    return
                served = self._served[key] = _Served()
            if len(served.parts) < MAX_BODY_PARTS:  # more cannot be a whole body: refused below
                served.parts.append(message.data)
        elif isinstance(message, Open):
            if served is None:
                served = self._served[key] = _Served()
            elif served.task is not None:
                return  # a duplicate
            served.task = self._spawn(self._serve(key, served, message))
            self._spawn(self._send(key.requester, "replies", Taken(message.run_id)))
        elif served is not None and isinstance(message, Credit):
            served.in_flight -= message.chars
            served.credited.set()
        elif served is not None and isinstance(message, Cancel):
            self._stop(key, served)

    def _stop(self, key: Served, served: _Served) -> None:
        self._served.pop(key, None)
        if served.task is not None:
            served.task.cancel()

    async def _serve(self, key: Served, served: _Served, order: Open) -> None:
        requester, run_id = key.requester, key.run_id
        # R-OBS-1: this task's log lines name the request (its own task: nothing leaks)
        REQUEST_ID.set(order.request_id[:MAX_REQUEST_ID_CHARS])
        RUN_ID.set(run_id[:64])
        whole = len(served.parts) == order.body_parts
        body = "".join(served.parts) if order.body_parts else order.body
        served.parts = []
        channel: RunChannel | None = None
        try:
            if not whole:
                raise NodeUnavailable("the run's body did not arrive whole")
            if not await self._alive(key.requester):
                raise NodeUnavailable("the requesting Edge process is not alive (R-SCALE-4)")
            spec = RunOrder(
                tunnel=order.tunnel,
                operation=order.operation,
                stream=order.stream,
                body=body.encode(),
                forward_headers=tuple(order.forward_headers.items()),
                request_id=order.request_id,
                traceparent=order.traceparent,
                seal=self._sealer(order),
            )
            channel = await self._local.open_local(
                run_id, order.node_id, order.provider_id, spec, order.window
            )
            await self._relay(requester, served, order, channel)
        except NodeUnavailable:
            error = wire.RunError(
                code="node_gone",
                message="the node is not connected to the Edge that held it",
                retryable=True,
                phase=wire.PHASE_CONNECT,
            )
            await self._send(requester, "replies", End(run_id, False, error))
        except SealRefused as exc:  # as a Node's refusal of the envelope (R-MGD-4)
            refused = wire.RunError(code="credential_refused", message=str(exc),
                                    phase=wire.PHASE_CONNECT)  # fmt: skip
            await self._send(requester, "replies", End(run_id, False, refused))
        except RedisError as exc:
            log.warning(
                "run %s for Edge %s not relayed: %s",
                printable(run_id, 64), printable(requester[0], 64), exc,
            )  # fmt: skip
            # Output was lost: the run ends here. Say so once more on a fresh connection (a
            # stale one after a Redis restart fails once), else the requester would wait on a
            # live owner for ever; if Redis is still away its own reader fails the run.
            lost = wire.RunError(code="relay_unavailable", message="run routing lost output")
            with contextlib.suppress(RedisError):
                await self._send(requester, "replies", End(run_id, False, lost))
        finally:
            self._served.pop(key, None)
            if channel is not None:
                self._local.close_run(channel)  # a run still going is cancelled on its Node

    def _sealer(self, order: Open) -> Callable[[str, str, int], dict[str, Any]] | None:
        """A managed run's sealer on this Edge, which knows the Node's generation."""
        if order.grant is None:
            return None
        if self.issuer is None:
            raise SealRefused("the Edge holding the node is not in managed mode")
        return self.issuer(order.grant, order.provider_id)

    async def _relay(
        self, requester: tuple[str, str], served: _Served, order: Open, channel: RunChannel
    ) -> None:
        """Forward the local run's output within the requester's credit: what is queued goes
        in one message, split where the room ends (as a Node splits at its credit), so a
        run never waits for credit that its own held output keeps from coming back."""
        run_id, window = order.run_id, order.window
        item: str | wire.RunEnd | None = await channel.get()
        while isinstance(item, str):
            while served.in_flight >= window:
                served.credited.clear()
                served.waiting = True
                await served.credited.wait()
                served.waiting = False
            room = min(window - served.in_flight, MAX_RELAY_CHARS)
            data: list[str] = []
            size = 0
            while isinstance(item, str) and size < room:
                piece = item[: room - size]
                data.append(piece)
                size += len(piece)
                item = item[len(piece) :] or channel.get_nowait()
            served.in_flight += size
            await self._send(requester, "replies", Output(run_id, "".join(data)))
            channel.release(size)  # what left for the requester: the Node may send more
            if item is None:
                item = await channel.get()
        assert item is not None  # the loop leaves only on the run's end
        await self._send(requester, "replies", End(run_id, item.ok, item.error, item.usage))
