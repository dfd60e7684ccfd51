"""The Stream Evidence Gate on the relay path (R-SEG-5, R-SEG-6, R-SEG-8).

``GatedSource`` is a ``RunSource`` over the attempt's source (the Node's channel, or its
translation to Chat): the relay reads gated Chat SSE from it and never learns of a recovery.
When a filter fires, the source discards the held text, cancels the run and releases its
lease, then re-issues the ingress snapshot through admission (``Recovery``) and reads on from
the new run; the client sees one stream with one id. docs/stream-evidence-gate.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from nodes import wire
from nodes.hub import NodeUnavailable
from nodes.runs import FilteredRun
from pool.engine import Lease
from pool.engine.errors import PoolError
from pool.gate import FilterPipeline, FilterSpec, GateVerdict
from pool.gate.chat_stream import GatedChat
from pool.gate.counters import EXHAUSTED, FIRED, OBSERVED, RECOVERED, GateCounts
from pool.gate.recovery import RESAMPLE, RecoveryPlan, continuation
from pool.http.attempt import Attempt, TargetOf, open_attempt
from pool.http.operations import ParsedRequest
from pool.http.relay import Exchange, RunSource
from pool.http.spent import Spent, TextTally, tokens_of

log = logging.getLogger("iop.gate")

REPETITION = "repetition_detected"
Admit = Callable[[frozenset[str]], Awaitable[Lease]]  # admission again, with an exclusion set


def gated_source(
    source: RunSource,
    attempt: Attempt,
    request: ParsedRequest,
    forward_headers: tuple[tuple[str, str], ...],
    target_of: TargetOf,
    ex: Exchange,
    admit: Admit,
    deadline: float | None,
) -> RunSource:
    """``source`` behind the gate when it applies to ``request``; else ``source`` itself."""
    gate = attempt.runtime.snapshot.stream_evidence_gate
    if not gate.enabled or not gate.filters or request.endpoint.operation != "chat_completions":
        return source
    if request.data.get("n") not in (None, 1):  # several choices interleave: not gated
        return source
    if request.body_bytes > gate.ingress_snapshot_bytes:
        log.warning(
            "stream evidence gate off for run %s: the request (%d bytes) is larger than "
            "ingress_snapshot_bytes (%d)",
            source.run_id, request.body_bytes, gate.ingress_snapshot_bytes,
        )  # fmt: skip
        return source
    specs = tuple(
        FilterSpec(f.type, f.hold_evidence_runes, f.enforcement == "observe") for f in gate.filters
    )
    plan = RecoveryPlan(
        gate.request_fault_recovery, gate.strategy_caps, request.data.get("temperature")
    )
    recovery = Recovery(
        attempt, request, forward_headers, target_of, ex, admit, deadline, specs, plan
    )
    return GatedSource(source, recovery)


class Recovery:
    """What a request needs to re-issue itself after a fire (R-SEG-4: fixed per request)."""

    __slots__ = (
        "admit", "attempt", "deadline", "ex", "forward_headers", "looped", "plan", "request",
        "snapshot", "specs", "strategy", "target_of",
    )  # fmt: skip

    def __init__(
        self,
        attempt: Attempt,
        request: ParsedRequest,
        forward_headers: tuple[tuple[str, str], ...],
        target_of: TargetOf,
        ex: Exchange,
        admit: Admit,
        deadline: float | None,
        specs: tuple[FilterSpec, ...],
        plan: RecoveryPlan,
    ) -> None:
        self.attempt = attempt
        self.request = request
        self.snapshot: dict[str, Any] = dict(request.data)  # the ingress snapshot (R-SEG-6)
        self.forward_headers = forward_headers
        self.target_of = target_of
        self.ex = ex
        self.admit = admit
        self.deadline = deadline
        self.specs = specs
        self.plan = plan
        self.looped: set[str] = set()  # providers that fired in this request
        self.strategy: str | None = None

    def pipeline(self) -> FilterPipeline:
        return FilterPipeline(self.specs)

    @property
    def counts(self) -> GateCounts:
        return self.attempt.runtime.gate

    def fired(self, provider_id: str) -> str | None:
        """Cancel the run, release its lease and choose the next strategy (None: exhausted)."""
        self.attempt.close()
        self.looped.add(provider_id)
        group = self.attempt.runtime.snapshot.models.get(self.request.model)
        others = set(group.providers) - self.looped if group is not None else set()
        self.strategy = self.plan.next(can_switch=bool(others))
        return self.strategy

    async def reissue(self, provider_id: str, delivered: str) -> RunSource | None:
        """The continuation's source, through admission within the original queue deadline;
        None when no provider can take it in time. Safe to call again after a cancellation."""
        if self.attempt.lease is None:
            group = self.attempt.runtime.snapshot.models.get(self.request.model)
            members = frozenset(group.providers) if group is not None else frozenset()
            if self.strategy == RESAMPLE:
                exclude = members - {provider_id}  # only the same provider
            else:
                exclude = frozenset(self.looped)
            loop = asyncio.get_running_loop()
            left = None if self.deadline is None else self.deadline - loop.time()
            if left is not None and left <= 0:
                return None
            try:
                async with asyncio.timeout(left):
                    self.attempt.lease = await self.admit(exclude)
            except (PoolError, TimeoutError):
                return None
        temperature = self.plan.temperature() if self.strategy == RESAMPLE else None
        data = continuation(self.snapshot, delivered, temperature)
        request = dataclasses.replace(self.request, data=data)
        try:
            opened = await open_attempt(
                self.attempt, request, self.forward_headers, self.target_of, self.ex
            )
        except NodeUnavailable:
            return None
        return None if opened is None else opened[0]


class GatedSource(FilteredRun):
    """A ``RunSource`` whose Chat SSE passed the gate, across every attempt of the request."""

    __slots__ = ("_chat", "_observed", "_provider", "_recovered", "_recovery", "_run")

    def __init__(self, source: RunSource, recovery: Recovery) -> None:
        super().__init__(source)
        self._recovery = recovery
        self._chat = GatedChat(recovery.pipeline(), recovery.request.name)
        lease = recovery.attempt.lease
        self._provider = lease.provider_id if lease is not None else ""
        self._recovered = False  # a recovery happened: count it when the stream is complete
        self._observed = False
        self._run = TextTally()  # model text the current run sent (R-BUD-2: metered if discarded)

    def get_nowait(self) -> str | wire.RunEnd | None:
        while not self._out:
            if self._chat.fired is not None:
                return None  # recovery awaits: ``get`` does it
            item = self._src.get_nowait()
            if item is None:
                return None
            self._take(item)
        return self._out.popleft()

    def wait(self) -> Awaitable[object]:
        """The recovery when the gate fired (``get_nowait`` has nothing until it is done),
        else the source's next item."""
        if self._chat.fired is not None:
            return self._recover()
        return self._src.wait()

    def _take(self, item: str | wire.RunEnd) -> None:
        """Gate one item; input that gave no output yet is held by the gate (at most its
        window), not by a client, so it is released at once (R-IN-5: the Node keeps sending)."""
        self._gate(item)
        if not self._out and self._chat.fired is None:
            self._src.release()

    def _gate(self, item: str | wire.RunEnd) -> None:
        chat = self._chat
        if isinstance(item, str):
            self._run.add(item)
            out = chat.feed(item)
        elif item.ok:
            out = chat.end()
        else:  # the run failed: what was held goes out before the error (unless it looped)
            out = chat.end()
            if chat.fired is not None:
                chat.fired, out = None, ""
        if chat.observed is not None and not self._observed:
            self._observe(chat.observed)
        if out:  # released before a fire in the same piece: already counted as delivered
            self._out.append(out)
        if chat.fired is not None:
            self._fire(chat.fired)
            return
        if self._recovered and (chat.done or (isinstance(item, wire.RunEnd) and item.ok)):
            self._recovered = False  # counted once, when the recovered stream is complete
            self._recovery.counts.add(self._provider, RECOVERED)
        if isinstance(item, wire.RunEnd):
            self._out.append(item)

    def _observe(self, verdict: GateVerdict) -> None:
        self._observed = True
        self._recovery.counts.add(self._provider, OBSERVED)
        log.warning(
            "stream evidence gate: %s observed a repeat on provider %s (run %s, %s); released",
            verdict.observed, self._provider, self._src.run_id, _evidence(verdict),
        )  # fmt: skip

    def _fire(self, verdict: GateVerdict) -> None:
        """Held text discarded (by the chat), run cancelled, lease released (R-SEG-6)."""
        recovery = self._recovery
        strategy = recovery.fired(self._provider)
        recovery.counts.add(self._provider, FIRED)
        # R-BUD-2: the discarded run produced what it sent, delivered or held; the request's
        # own usage is then the next run's (its text counted from here).
        ex = recovery.ex
        estimate = recovery.request.input_tokens_estimate
        ex.spent.append(Spent(self._provider, estimate, tokens_of(self._run.chars)))
        ex.tally, self._run = TextTally(), TextTally()
        log.warning(
            "stream evidence gate: %s fired on provider %s (run %s, %s); recovery: %s",
            verdict.fired, self._provider, self._src.run_id, _evidence(verdict),
            strategy or "exhausted",
        )  # fmt: skip
        if strategy is None:
            self._exhausted("recovery is exhausted")

    async def _recover(self) -> None:
        recovery = self._recovery
        if recovery.strategy is None:  # already reported as exhausted
            return
        source = await recovery.reissue(self._provider, self._chat.delivered_text)
        if source is None:
            recovery.strategy = None
            self._exhausted("no provider could take the recovery in time")
            return
        lease = recovery.attempt.lease
        self._provider = lease.provider_id if lease is not None else self._provider
        self._src = source
        self._recovered = True
        self._chat.restart(recovery.pipeline())

    def _exhausted(self, why: str) -> None:
        self._recovery.counts.add(self._provider, EXHAUSTED)
        self._chat.fired = None  # nothing more is read: the stream ends with the error
        message = f"the output kept repeating itself and {why}"
        error = wire.RunError(code=REPETITION, message=message)
        self._out.append(wire.RunEnd(run_id=self._src.run_id, ok=False, error=error))


def _evidence(verdict: GateVerdict) -> str:
    """The repeat's shape for a log line: sizes only, never the text (it is model output)."""
    found = verdict.evidence
    if found is None:
        return "no evidence"
    return f"a {len(found.unit)}-rune unit x {found.copies}"
