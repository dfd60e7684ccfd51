"""The Node's side of R-OBS-1 and R-OBS-2: a run's context, its span, its upstream call.

``RunTracer.begin`` makes the context a run's tasks are created in: the request id, run id,
trace id and provider for every log line, and (only while tracing runs) the run span,
a child of the Edge's request span named by the run message's ``traceparent``.
``upstream_call`` is what the HTTP adapters send upstream: ``x-request-id`` and a
``traceparent`` (of the upstream-call span, else the one the run carried), so an upstream
that traces (vLLM does) continues the same trace.
"""

from __future__ import annotations

import contextvars
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import msgspec

from nodes import wire
from obskit.context import (
    PROVIDER,
    REQUEST_ID,
    REQUEST_ID_HEADER,
    RUN_ID,
    TRACE_ID,
    TRACEPARENT,
    TRACEPARENT_HEADER,
    request_id_from,
    trace_id_of,
    traceparent_from,
)

if TYPE_CHECKING:
    from obskit.otel import Tracing

# The tracer of the run in context: set only while tracing runs.
_TRACER: ContextVar[Any] = ContextVar("iop_run_tracer", default=None)


class _Model(msgspec.Struct):
    model: str = ""


_model_of = msgspec.json.Decoder(_Model).decode


class RunTracer:
    """Opens and ends the observed context of each run on this Node."""

    def __init__(self, node_id: str, tracing: Tracing | None = None) -> None:
        self.node_id = node_id
        self.tracing = tracing

    def begin(
        self, message: wire.RunRequest | wire.TunnelRequest, body: bytes
    ) -> tuple[contextvars.Context, Any]:
        """The context the run's tasks start in, and its span (None unless tracing)."""
        ctx = contextvars.copy_context()
        return ctx, ctx.run(self._enter, message, body)

    def _enter(self, message: wire.RunRequest | wire.TunnelRequest, body: bytes) -> Any:
        # The Edge checked both; the Node bounds them again (R-OBS-1: every input bounded).
        request_id = request_id_from(message.request_id.encode()) if message.request_id else ""
        traceparent = traceparent_from(message.traceparent)
        REQUEST_ID.set(request_id)
        RUN_ID.set(message.run_id[:64])
        PROVIDER.set(message.provider_id[:200])
        TRACEPARENT.set(traceparent)
        if self.tracing is None:
            TRACE_ID.set(trace_id_of(traceparent))
            return None
        from obskit import spans

        span = spans.start(self.tracing.tracer, "run", traceparent, spans.INTERNAL)
        try:
            model = _model_of(body).model[:200] if body else ""
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            model = ""
        operation = spans.genai_operation(message.operation)
        span.update_name(f"{operation} {model}" if model else operation)
        span.set_attributes({
            spans.OPERATION: operation,
            spans.PROVIDER: message.provider_id[:200],
            spans.NODE: self.node_id,
            spans.RUN_ID: message.run_id[:64],
        })  # fmt: skip
        if model:
            span.set_attribute(spans.REQUEST_MODEL, model)
            span.set_attribute(spans.RESPONSE_MODEL, model)
        if request_id:
            span.set_attribute(spans.REQUEST_ID, request_id)
        spans.activate(span)
        _TRACER.set(self.tracing.tracer)
        TRACE_ID.set(spans.trace_id_of(span))
        return span

    @staticmethod
    def end(span: Any, end: wire.RunEnd) -> None:
        """End the run span with its usage and outcome (no text of the run)."""
        if span is None:
            return
        from obskit import spans

        if end.usage is not None:
            spans.set_usage(span, end.usage.input_tokens, end.usage.output_tokens)
        spans.end(span, None if end.ok or end.error is None else end.error.code)


class UpstreamCall:
    """One upstream HTTP exchange of a run: the headers to add, and its span."""

    __slots__ = ("headers", "span")

    def __init__(self, method: str, url: str) -> None:
        self.headers: dict[str, str] = {}
        self.span: Any = None
        request_id = REQUEST_ID.get()
        if request_id:
            self.headers[REQUEST_ID_HEADER] = request_id
        tracer = _TRACER.get()
        if tracer is not None:
            from obskit import spans

            self.span = span = tracer.start_span(f"{method} upstream", kind=spans.CLIENT)
            span.set_attributes({"http.request.method": method, "url.full": _safe_url(url)})
            self.headers[TRACEPARENT_HEADER] = spans.traceparent_of(span)
        elif traceparent := TRACEPARENT.get():
            self.headers[TRACEPARENT_HEADER] = traceparent

    def done(self, status: int, error_code: str | None = None) -> None:
        span, self.span = self.span, None
        if span is None:
            return
        from obskit import spans

        spans.end(span, error_code, {"http.response.status_code": status or None})


def upstream_call(method: str, url: str) -> UpstreamCall | None:
    """The observed upstream call of the run in context; None outside a run (a probe)."""
    if not RUN_ID.get():
        return None
    return UpstreamCall(method, url)


def _safe_url(url: str) -> str:
    """The URL without user-info or query (no credential ever lands on a span)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"[:300]
