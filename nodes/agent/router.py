"""Handles the Edge's messages on one connection: runs (one task each), cancel, refresh.

Every run that starts ends with exactly one run_end, whatever happens, unless the
connection itself is lost (then the Edge has already failed it).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from nodes import wire
from nodes.agent.adapters.base import AdapterError, RunSpec
from nodes.agent.credentials import LeaseCredentials
from nodes.agent.envelope import EnvelopeRefused
from nodes.agent.outbox import RunOutput, SendMessage
from nodes.agent.prober import Prober
from nodes.agent.registry import Registries
from nodes.agent.tracing import RunTracer

log = logging.getLogger("iop_node.router")

_END_MESSAGES = {
    "cancelled": "run cancelled by the edge",
    "node_shutdown": "the node is shutting down",
}


MAX_PENDING_BODIES = 64  # runs whose body is still arriving in parts, per connection


@dataclass(eq=False)
class _Run:
    """One run: its task runs the adapter, then sends the output and the run_end."""

    run_id: str
    end_code: str = "cancelled"  # what a cancel of the task ends the run with
    task: asyncio.Task[None] | None = None
    started: bool = False  # its task began: a cancel now reaches the adapter
    stop: bool = False  # cancelled before its task began (its first step sees this)
    adapter_done: bool = False  # the upstream is done: only output and run_end are left
    gone: bool = False  # the connection is lost: the run ends without a run_end
    out: RunOutput | None = field(default=None, repr=False)
    span: Any = field(default=None, repr=False)  # R-OBS-2: the run span, while tracing

    def cancel(self) -> bool:
        """Cancel the run's task; one not yet begun is stopped at its first step instead
        (a task cancelled before it begins never runs its handlers: no run_end)."""
        if self.task is None or self.task.done():
            return False
        if self.started:
            return self.task.cancel()
        self.stop = True
        return True


class _Bodies:
    """Run bodies arriving in parts (R-IN-2), bounded in count and characters."""

    def __init__(self) -> None:
        self.parts: dict[str, list[str]] = {}
        self.chars: dict[str, int] = {}
        self.refused: set[str] = set()

    def add(self, part: wire.RunBodyPart) -> None:
        run_id = part.run_id
        if run_id in self.refused:
            return
        if run_id not in self.parts and len(self.parts) >= MAX_PENDING_BODIES:
            self._refuse(run_id, "too many bodies arriving at once")
            return
        size = self.chars.get(run_id, 0) + len(part.data)
        if size > wire.MAX_BODY_CHARS:
            self._refuse(run_id, f"body larger than {wire.MAX_BODY_CHARS} characters")
            return
        self.parts.setdefault(run_id, []).append(part.data)
        self.chars[run_id] = size

    def take(self, run_id: str, count: int) -> bytes | None:
        """The whole body, or None when it was refused or is not complete."""
        parts = self.parts.pop(run_id, [])
        self.chars.pop(run_id, None)
        if run_id in self.refused or len(parts) != count:
            self.refused.discard(run_id)
            return None
        return "".join(parts).encode()

    def drop(self, run_id: str) -> None:
        self.parts.pop(run_id, None)
        self.chars.pop(run_id, None)
        self.refused.discard(run_id)

    def _refuse(self, run_id: str, reason: str) -> None:
        log.warning("run %s: %s; the run will be refused", run_id, reason)
        self.drop(run_id)
        self.refused.add(run_id)


class Router:
    """Dispatches Edge -> Node messages by type for one connection."""

    def __init__(
        self,
        registries: Registries,
        send: SendMessage,
        *,
        credentials: LeaseCredentials | None = None,
        generation: int | None = None,
        tracer: RunTracer | None = None,
    ) -> None:
        self.registries = registries
        self.tracer = tracer or RunTracer("")
        self._send = send
        self._credentials = credentials or LeaseCredentials(None, "")
        self._generation = generation
        self.runs: dict[str, _Run] = {}
        self.bodies = _Bodies()
        self.accepting = True
        self.prober = Prober(send)  # R-HEALTH-3: follows the current registry

    async def handle(self, message: wire.EdgeToNode) -> None:
        """Handle one message quickly; runs continue in their own tasks."""
        if isinstance(message, wire.RunBodyPart):
            self.bodies.add(message)
        elif isinstance(message, wire.Credit):
            run = self.runs.get(message.run_id)
            if run is not None and run.out is not None:
                run.out.grant(message.chars)
        elif isinstance(message, wire.RunRequest | wire.TunnelRequest):
            await self._start(message)
        elif isinstance(message, wire.Cancel):
            self.bodies.drop(message.run_id)
            self.cancel(message.run_id, "cancelled")
        elif isinstance(message, wire.ConfigRefresh):
            await self._refresh(message.payload)
        elif isinstance(message, wire.Ping):
            await self._safe_send(wire.Pong(ts=message.ts))
        elif isinstance(message, wire.ErrorMessage):
            log.warning("edge reported %s: %s", message.code, message.message)
        elif isinstance(message, wire.Pong):
            pass  # any frame counts as liveness; the client loop tracks it
        else:
            log.warning("ignoring unexpected %s after registration", type(message).__name__)

    async def _start(self, message: wire.RunRequest | wire.TunnelRequest) -> None:
        run_id = message.run_id
        body = bytes(message.body)
        if message.body_parts:
            joined = self.bodies.take(run_id, message.body_parts)
            if joined is None:
                await self._end(run_id, wire.RunError("bad_request", "the run body is incomplete"))
                return
            body = joined
        if run_id in self.runs:
            log.warning("run %s is already running; duplicate request ignored", run_id)
            return
        # R-OBS-1, R-OBS-2: the run's tasks, log lines and spans carry its request context.
        ctx, span = self.tracer.begin(message, body)
        if not self.accepting:
            error = wire.RunError("node_shutdown", _END_MESSAGES["node_shutdown"], retryable=True)
            await self._refuse(run_id, span, ctx, error)
            return
        registry = self.registries.current
        try:
            if registry is None:
                raise AdapterError("unknown_provider", "the node has no configuration yet")
            adapter = registry.get(message.provider_id)
        except AdapterError as exc:
            await self._refuse(run_id, span, ctx, exc.to_wire(), exc)
            return
        forward = message.forward_headers if isinstance(message, wire.TunnelRequest) else {}
        try:  # R-MGD-4: the run's own credential, for this one upstream call or program
            credential = self._credentials.secret(
                message.lease_envelope,
                run_id=run_id,
                provider=registry.providers.get(message.provider_id),
                generation=self._generation,
            )
        except EnvelopeRefused as exc:
            refused = AdapterError(
                "credential_refused",
                f"lease envelope refused: {exc}",
                detail=f"lease envelope refused ({exc.reason}): {exc}",
            )
            await self._refuse(run_id, span, ctx, refused.to_wire(), refused)
            return
        spec = RunSpec(
            run_id=run_id,
            operation=message.operation,
            stream=message.stream,
            body=body,
            forward_headers=forward,
            credential=credential,
        )
        if log.isEnabledFor(logging.DEBUG):  # --log-level DEBUG: ids only, never the secret
            envelope = message.lease_envelope
            log.debug("run %s: %s on provider %s, lease envelope %s", run_id, message.operation,
                      message.provider_id, envelope.get("id") if envelope else "none")  # fmt: skip
        out = RunOutput(run_id, self._send, credit=message.credit, hold=not message.stream)
        run = _Run(run_id, out=out, span=span)
        self.runs[run_id] = run
        # The run stays on the registry it started with, even after a swap (R-NODE-5);
        # counted from now until its adapter is done, however it ends.
        registry.begin_run()
        try:
            work = adapter.run(spec, out.emit)
            run.task = asyncio.create_task(
                self._supervise(run, out, work, registry.end_run), name=f"run-{run_id}", context=ctx
            )
        except BaseException:
            registry.end_run()
            raise

    async def _refuse(
        self,
        run_id: str,
        span: Any,
        ctx: contextvars.Context,
        error: wire.RunError,
        exc: AdapterError | None = None,
    ) -> None:
        """A run refused before any adapter ran: logged and ended in its own context."""
        if exc is not None:
            ctx.run(_log_failure, run_id, exc)
        RunTracer.end(span, wire.RunEnd(run_id=run_id, ok=False, error=error))
        await self._end(run_id, error)

    async def _supervise(
        self,
        run: _Run,
        out: RunOutput,
        work: Coroutine[Any, Any, wire.Usage | None],
        ended: Callable[[], None],
    ) -> None:
        end: wire.RunEnd
        try:
            try:
                if run.stop:
                    work.close()
                    raise asyncio.CancelledError
                run.started = True
                usage = await work
            finally:
                run.adapter_done = True
                ended()
            end = wire.RunEnd(run_id=run.run_id, ok=True, usage=usage, data=await out.last())
        except AdapterError as exc:
            _log_failure(run.run_id, exc)
            await out.drain()
            end = wire.RunEnd(run_id=run.run_id, ok=False, error=_phased(exc.to_wire(), out))
        except asyncio.CancelledError:
            if run.gone:
                self.runs.pop(run.run_id, None)
                gone = wire.RunError(code="node_gone", message="the connection to the Edge ended")
                RunTracer.end(run.span, wire.RunEnd(run_id=run.run_id, ok=False, error=gone))
                raise  # the connection is gone: nothing to tell the Edge
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()  # the run's own cancel, taken: its run_end still goes out
            await out.drain(discard=True)
            error = wire.RunError(
                code=run.end_code,
                message=_END_MESSAGES.get(run.end_code, run.end_code),
                retryable=run.end_code == "node_shutdown",
            )
            end = wire.RunEnd(run_id=run.run_id, ok=False, error=_phased(error, out))
        except Exception as exc:
            # Details go to the local log only; the Edge gets no traceback text.
            log.exception("run %s failed unexpectedly", run.run_id)
            await out.drain()
            error = wire.RunError(
                code="upstream_error", message=f"internal node error ({type(exc).__name__})"
            )
            end = wire.RunEnd(run_id=run.run_id, ok=False, error=error)
        self.runs.pop(run.run_id, None)
        RunTracer.end(run.span, end)
        await self._safe_send(end)

    def cancel(self, run_id: str, code: str) -> bool:
        """End a run with ``code``: its adapter task is cancelled (upstream closed,
        subprocess killed) and it reports run_end. False if it is not running."""
        run = self.runs.get(run_id)
        if run is None:
            return False
        if run.adapter_done:
            if run.out is not None:
                run.out.discard()  # the upstream is done; its output waits for credit: drop it
            return False
        run.end_code = code
        return run.cancel()

    async def _refresh(self, payload: wire.NodePayload) -> None:
        # R-NODE-5: new runs use the new registry; the old one closes after its runs drain.
        registry = self.registries.install(payload)
        self.prober.follow(registry)
        errors = "; ".join(registry.errors.values())
        log.info("config refresh: now on revision %s", payload.revision)
        await self._safe_send(
            wire.ConfigRefreshAck(
                revision=payload.revision,
                ok=not errors,
                error=errors or None,
                unavailable=dict(registry.errors),
            )
        )

    async def shutdown(self, grace_s: float) -> None:
        """Refuse new runs, let running ones finish within ``grace_s``, then end the rest
        with node_shutdown."""
        self.accepting = False
        await self.prober.aclose()
        tasks = [r.task for r in self.runs.values() if r.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
        for run_id in list(self.runs):
            self.cancel(run_id, "node_shutdown")
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def abort(self) -> None:
        """The connection is gone: cancel every run without reporting (the Edge failed them)."""
        self.accepting = False
        await self.prober.aclose()
        tasks = []
        for run in self.runs.values():
            if run.task is not None:
                run.gone = True
                run.cancel()
                tasks.append(run.task)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self.runs.clear()

    async def _end(self, run_id: str, error: wire.RunError) -> None:
        if not error.phase:
            error.phase = wire.PHASE_BEFORE_FIRST_BYTE  # refused before any adapter ran
        await self._safe_send(wire.RunEnd(run_id=run_id, ok=False, error=error))

    async def _safe_send(self, message: wire.NodeToEdge) -> None:
        try:
            await self._send(message)
        except Exception as exc:  # the client loop notices the closed connection itself
            log.debug("could not send %s (%s)", type(message).__name__, type(exc).__name__)


def _log_failure(run_id: str, exc: AdapterError) -> None:
    """The one place a run's failure detail is written: this Node's log, with the run id
    (the Edge and the caller get only the generic message, docs/http-api.md)."""
    status = f" (HTTP {exc.status})" if exc.status else ""
    log.warning("run %s failed: %s%s: %s", run_id, exc.code, status, exc.log_text)


def _phased(error: wire.RunError, out: RunOutput) -> wire.RunError:
    """R-HEALTH-1: once output went to the Edge the failure is after the first byte, whatever
    the adapter said; an adapter that did not say and emitted nothing failed before it."""
    if out.emitted:
        error.phase = wire.PHASE_AFTER_FIRST_BYTE
        error.retryable = False
    elif not error.phase:
        error.phase = wire.PHASE_BEFORE_FIRST_BYTE
    return error
