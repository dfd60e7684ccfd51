"""The OpenTelemetry SDK, started from the standard ``OTEL_*`` variables only (R-OBS-2).

Nothing here is imported by the request path: with no OTLP endpoint set (or
``OTEL_SDK_DISABLED=true``) ``start_tracing`` returns None and the SDK is never loaded. The
SDK reads every other variable itself (sampler, batch sizes, timeout, headers, service name);
only the choices it cannot make are made here: the exporter (OTLP over HTTP), a default
service name, a bounded shutdown, and one rate-limited warning for export failures, so a
collector that is down, slow or failing never slows or fails a request.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from obskit.logs import printable

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

log = logging.getLogger("iop.tracing")

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
SUPPORTED_PROTOCOL = "http/protobuf"
# The samplers the SDK knows by name; the ratio ones take OTEL_TRACES_SAMPLER_ARG in 0..1.
SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on",
            "parentbased_always_off", "parentbased_traceidratio")  # fmt: skip
SHUTDOWN_WAIT_S = 3.0  # at exit, the last spans get this long to leave


class TracingConfigError(ValueError):
    """An ``OTEL_*`` value this process cannot honour (refused at start, with the name)."""


def tracing_requested(environ: Mapping[str, str] = os.environ) -> bool:
    """An OTLP endpoint is set and the SDK is not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def check_environment(environ: Mapping[str, str] = os.environ) -> None:
    """Refuse what the SDK would only warn about and replace: a protocol other than OTLP over
    HTTP, an unknown sampler, a ratio that is not a number in 0..1."""
    sampler = environ.get("OTEL_TRACES_SAMPLER", "").strip()
    if sampler and sampler not in SAMPLERS:
        raise TracingConfigError(
            f"OTEL_TRACES_SAMPLER={sampler[:40]!r}: not one of {', '.join(SAMPLERS)}"
        )
    arg = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    if arg and sampler.endswith("traceidratio"):
        try:
            ratio = float(arg)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise TracingConfigError(
                f"OTEL_TRACES_SAMPLER_ARG={arg[:40]!r}: a ratio from 0 to 1 is expected"
            )
    for name in PROTOCOL_VARIABLES:
        value = environ.get(name, "").strip()
        if value and value != SUPPORTED_PROTOCOL:
            raise TracingConfigError(
                f"{name}={value[:40]!r}: only {SUPPORTED_PROTOCOL} is supported "
                "(docs/observability.md)"
            )
        if value:
            return  # the traces-specific variable wins over the general one


class Tracing:
    """The running SDK of one process: its tracer, and a bounded shutdown."""

    def __init__(self, provider: TracerProvider, tracer: Tracer, exporter: Any = None) -> None:
        self.provider = provider
        self.tracer = tracer
        self._exporter = exporter

    @property
    def failed_batches(self) -> int:
        """Span batches whose export failed since start (``iop_trace_export_failures``)."""
        return int(getattr(self._exporter, "failed_batches", 0))

    def shutdown(self, wait_s: float = SHUTDOWN_WAIT_S) -> None:
        """Flush what is queued, waiting at most ``wait_s`` (a hanging collector must not
        hold the process)."""
        done = threading.Thread(target=self.provider.shutdown, name="otel-shutdown", daemon=True)
        done.start()
        done.join(wait_s)


def start_tracing(default_service: str, environ: Mapping[str, str] = os.environ) -> Tracing | None:
    """The SDK with a batch processor and the OTLP/HTTP exporter, or None when not asked for.
    Raises ``TracingConfigError`` for a value it cannot honour."""
    if not tracing_requested(environ):
        return None
    check_environment(environ)
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": default_service}
    provider = TracerProvider(resource=Resource.create(attributes), shutdown_on_exit=False)
    from obskit.otel_export import QuietExporter

    exporter = QuietExporter(OTLPSpanExporter(), _endpoint(environ))
    # Exports run on the processor's own thread; its queue is bounded (OTEL_BSP_MAX_QUEUE_SIZE,
    # 2048 by default) and drops spans when full, so the event loop never waits for it.
    provider.add_span_processor(BatchSpanProcessor(exporter))
    # The exporter's own per-batch error lines are replaced by QuietExporter's warning.
    logging.getLogger("opentelemetry.exporter").setLevel(logging.CRITICAL)
    trace.set_tracer_provider(provider)
    return Tracing(provider, provider.get_tracer("iop"), exporter)


def _endpoint(environ: Mapping[str, str]) -> str:
    for name in ENDPOINT_VARIABLES:
        if environ.get(name, "").strip():
            return shown_endpoint(environ[name].strip())
    return ""


def shown_endpoint(url: str) -> str:
    """The endpoint as a log line may show it (R-TLS-9): scheme, host, port and path; never
    its user-info (``user:password@``), query or fragment, which may carry credentials."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an endpoint that is not a URL)"
    host = f"[{host}]" if ":" in host else host
    return printable(f"{parts.scheme}://{host}{port}{parts.path}", 200)
