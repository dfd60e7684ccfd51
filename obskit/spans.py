"""Span helpers over the OpenTelemetry API; imported only once tracing has started.

GenAI semantic-convention attribute names (R-OBS-2) are named here once for both sides.
No prompt or completion text is ever put on a span.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

OPERATION = "gen_ai.operation.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
PROVIDER = "iop.provider"
NODE = "iop.node"
PRINCIPAL = "iop.principal"
REQUEST_ID = "iop.request_id"
RUN_ID = "iop.run_id"

# The Edge's operations as GenAI operation names; others keep their own name.
_GENAI_OPERATIONS = {
    "chat_completions": "chat",
    "messages": "chat",
    "responses": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
}
_propagator = TraceContextTextMapPropagator()

SERVER, INTERNAL, CLIENT = SpanKind.SERVER, SpanKind.INTERNAL, SpanKind.CLIENT


def genai_operation(operation: str) -> str:
    return _GENAI_OPERATIONS.get(operation, operation)


def start(tracer: Tracer, name: str, traceparent: str, kind: SpanKind) -> Span:
    """A span continuing ``traceparent`` (a valid one; "" starts a new trace), or the span
    current in this context when there is none."""
    parent = _propagator.extract({"traceparent": traceparent}) if traceparent else None
    return tracer.start_span(name, context=parent, kind=kind)


def activate(span: Span) -> object:
    """Make ``span`` current in this context; the token undoes it."""
    return otel_context.attach(trace.set_span_in_context(span))


def deactivate(token: object) -> None:
    otel_context.detach(token)  # type: ignore[arg-type]


def traceparent_of(span: Span) -> str:
    """The W3C traceparent naming ``span`` (what the propagator's ``inject`` writes, without
    building a context per request)."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def trace_id_of(span: Span) -> str:
    return f"{span.get_span_context().trace_id:032x}"


def set_usage(span: Span, input_tokens: int, output_tokens: int) -> None:
    span.set_attribute(INPUT_TOKENS, input_tokens)
    span.set_attribute(OUTPUT_TOKENS, output_tokens)


def end(span: Span, error_code: str | None, attributes: dict[str, Any] | None = None) -> None:
    """End ``span`` with its attributes; an error code marks it failed (``error.type``)."""
    if attributes:
        span.set_attributes({k: v for k, v in attributes.items() if v not in (None, "")})
    if error_code:
        span.set_attribute("error.type", error_code)
        span.set_status(Status(StatusCode.ERROR))
    span.end()
