"""``OtlpReceiver``: a loopback OTLP/HTTP trace receiver that decodes what it is sent.

It speaks the real wire format: ``POST /v1/traces`` with a protobuf
``ExportTraceServiceRequest`` (decoded with ``opentelemetry-proto``). ``mode`` makes it a
failing collector: ``"error"`` answers 500, ``"hang"`` never answers until it is stopped;
``"sink"`` accepts and counts without decoding (the tracing bench).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}


def tracing_env(endpoint: str, **extra: str) -> dict[str, str]:
    """The environment of an Edge and Nodes that trace everything to ``endpoint`` (sampled
    1.0, exported every 100 ms) and write JSON logs with an access line per request."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "1.0",
        "LOG_FORMAT": "json",
        "IOP_ACCESS_LOG": "1",
        **FAST_EXPORT,
        **extra,
    }


@dataclass
class Span:
    """One received span, flattened."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    status_code: int = 0
    raw: bytes = b""  # the span's protobuf bytes: every string it carries is in here


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _attributes(items: Any) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in items}


class OtlpReceiver:
    """Runs on its own thread; ``spans`` holds everything received, in order."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.spans: list[Span] = []
        self.posts = 0  # export requests received (any mode)
        self._lock = threading.Condition()
        self._stop = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with receiver._lock:
                    receiver.posts += 1
                    receiver._lock.notify_all()
                if receiver.mode == "hang":
                    receiver._stop.wait(60)
                    return
                if receiver.mode == "error":
                    self.send_response(500)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if receiver.mode != "sink":
                    receiver._take(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        """The base endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``); the SDK adds ``/v1/traces``."""
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        spans = []
        for resource_spans in request.resource_spans:
            service = str(_attributes(resource_spans.resource.attributes).get("service.name"))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        Span(
                            service=service,
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            attributes=_attributes(span.attributes),
                            events=[(e.name, _attributes(e.attributes)) for e in span.events],
                            status_code=span.status.code,
                            raw=span.SerializeToString(),
                        )
                    )
        with self._lock:
            self.spans.extend(spans)
            self._lock.notify_all()

    def wait_for(self, done: Any, within: float = 20.0, what: str = "spans") -> list[Span]:
        """Wait until ``done(spans)`` holds; AssertionError after ``within`` seconds."""
        deadline = time.monotonic() + within
        with self._lock:
            while not done(self.spans):
                left = deadline - time.monotonic()
                if left <= 0:
                    names = [(s.service, s.name) for s in self.spans]
                    raise AssertionError(f"{what} not received within {within}s: {names}")
                self._lock.wait(left)
            return list(self.spans)

    def wait_posts(self, count: int, within: float = 20.0) -> None:
        deadline = time.monotonic() + within
        with self._lock:
            while self.posts < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{count} export(s) not received within {within}s")
                self._lock.wait(left)

    def stop(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()
