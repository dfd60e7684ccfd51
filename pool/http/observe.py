"""The Edge's request boundary, observed (R-OBS-1..3): request id, request span, timings.

``begin`` runs at the door of every ``/v1`` request: it takes or makes the request id, puts
it (and the trace id) in the request's ``contextvars`` for every log line, wraps ``send`` so
each answer carries ``x-request-id``, and, only when tracing runs, opens the request span
continuing an incoming ``traceparent``. ``admission`` times the queue wait; ``run_ids`` is
what a run message carries to the Node. Without tracing nothing here touches OpenTelemetry.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from types import TracebackType
from typing import TYPE_CHECKING, Any

from edgekit.http import Send
from obskit.context import (
    NODE,
    PROVIDER,
    REQUEST_ID,
    REQUEST_ID_HEADER,
    RUN_ID,
    TRACE_ID,
    request_id_from,
    trace_id_of,
    traceparent_from,
)

if TYPE_CHECKING:
    from obskit.otel import Tracing

_PING = b": ping\n\n"  # pool.http.relay.PING: an idle stream's comment is not output
_REQUEST_ID_NAME = REQUEST_ID_HEADER.encode()


class Observation:
    """What one request's observation holds between the door and its end."""

    __slots__ = ("_token", "admissions", "admitted_at", "first_byte_at", "outcome",
                 "queue_wait_s", "request_id", "span", "started", "traceparent")  # fmt: skip

    def __init__(self, request_id: str, traceparent: str, started: float) -> None:
        self.request_id = request_id
        self.traceparent = traceparent  # what runs carry: the request span's, else the caller's
        self.started = started
        self.queue_wait_s: float | None = None  # time spent in admission (all attempts)
        self.admitted_at: float | None = None
        self.first_byte_at: float | None = None  # the first output byte sent to the client
        self.admissions = 0
        self.outcome = ""  # the last admission's: admitted, or the refusal's code
        self.span: Any = None
        self._token: object = None


CURRENT: ContextVar[Observation | None] = ContextVar("iop_observation", default=None)


def begin(headers: dict[bytes, bytes], tracing: Tracing | None, name: str) -> Observation:
    """Open the request's observation in this context (the request's own task)."""
    request_id = request_id_from(headers.get(_REQUEST_ID_NAME))
    REQUEST_ID.set(request_id)
    raw = headers.get(b"traceparent")
    incoming = traceparent_from(raw) if raw is not None else ""
    obs = Observation(request_id, incoming, time.perf_counter())
    if tracing is not None:
        from obskit import spans

        obs.span = span = spans.start(tracing.tracer, name, incoming, spans.SERVER)
        obs._token = spans.activate(span)
        obs.traceparent = spans.traceparent_of(span)
        TRACE_ID.set(spans.trace_id_of(span))
    elif incoming:
        TRACE_ID.set(trace_id_of(incoming))  # passed on unchanged to the Node and upstream
    CURRENT.set(obs)
    return obs


def answering(send: Send, obs: Observation) -> Send:
    """``send`` with ``x-request-id`` on the response head (R-OBS-1) and the first output
    byte timed (R-OBS-3)."""
    header = (_REQUEST_ID_NAME, obs.request_id.encode())

    async def send_observed(message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            message["headers"] = [*message["headers"], header]
        elif obs.first_byte_at is None and kind == "http.response.body":
            body = message.get("body")
            if body and body != _PING:
                obs.first_byte_at = time.perf_counter()
        await send(message)

    return send_observed


class admission:  # lower case: it reads as ``with observe.admission():``
    """Times one admission to the pool for the request in context (its queue wait) and
    notes the outcome on its span; a no-op outside an observed request."""

    __slots__ = ("_obs", "_start")

    def __enter__(self) -> None:
        self._obs = CURRENT.get()
        self._start = time.perf_counter()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        obs = self._obs
        if obs is None:
            return
        now = time.perf_counter()
        obs.queue_wait_s = (obs.queue_wait_s or 0.0) + (now - self._start)
        if kind is None and obs.admitted_at is None:
            obs.admitted_at = now
        obs.admissions += 1
        obs.outcome = "admitted" if kind is None else str(getattr(exc, "code", "refused"))


def running(run_id: str, node_id: str, provider_id: str) -> None:
    """The request's run is open: the Edge's log lines about it name the run, Node and
    provider from now on (R-OBS-4)."""
    RUN_ID.set(run_id)
    NODE.set(node_id)
    PROVIDER.set(provider_id)


def run_ids() -> tuple[str, str]:
    """(request id, traceparent) a run message carries (R-OBS-1, R-OBS-2)."""
    obs = CURRENT.get()
    if obs is None:
        return REQUEST_ID.get(), ""
    return obs.request_id, obs.traceparent


def ttft_s(obs: Observation, stream: bool, status: int) -> float | None:
    """Time to the first token (R-OBS-3): arrival to the first output byte of a stream."""
    if not stream or status != 200 or obs.first_byte_at is None:
        return None
    return obs.first_byte_at - obs.started


def finish(
    obs: Observation,
    error_code: str | None,
    *,
    operation: str,
    request_model: str | None,
    response_model: str | None,
    input_tokens: int,
    output_tokens: int,
    provider: str | None,
    node: str | None,
    principal: str | None,
    status: int,
) -> None:
    """End the request's span (when tracing) with the GenAI attributes; never the prompt or
    the output."""
    span = obs.span
    if span is None:
        return
    from obskit import spans

    obs.span = None
    waited = obs.queue_wait_s
    if request_model:
        span.update_name(f"{spans.genai_operation(operation)} {request_model}")
    spans.end(span, error_code, {
        spans.OPERATION: spans.genai_operation(operation),
        spans.REQUEST_MODEL: request_model,
        spans.RESPONSE_MODEL: response_model,
        spans.INPUT_TOKENS: input_tokens,
        spans.OUTPUT_TOKENS: output_tokens,
        spans.PROVIDER: provider,
        spans.NODE: node,
        spans.PRINCIPAL: principal,
        spans.REQUEST_ID: obs.request_id,
        "http.response.status_code": status,
        # R-OBS-2: the admission, as attributes (an event per admission costs more)
        "iop.admission": obs.outcome,
        "iop.admissions": obs.admissions,
        "iop.queue_wait_ms": None if waited is None else round(waited * 1000, 3),
    })  # fmt: skip
    if obs._token is not None:
        spans.deactivate(obs._token)
        obs._token = None
