"""The exporter wrapper of ``obskit.otel``; imported only once tracing starts (it loads the SDK)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger("iop.tracing")

WARN_EVERY_S = 60.0  # at most one export-failure warning a minute


class QuietExporter(SpanExporter):  # type: ignore[misc]
    """Wraps the OTLP exporter: a failed export (refused, timed out, HTTP 5xx) is counted
    and reported by at most one warning a minute; nothing is raised to the processor."""

    def __init__(self, inner: Any, endpoint: str, every_s: float = WARN_EVERY_S) -> None:
        self._inner = inner
        self._endpoint = endpoint
        self._every_s = every_s
        self._next_warning = 0.0
        self.failed_batches = 0
        self._unreported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> Any:
        try:
            result = self._inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self.failed_batches += 1
            self._unreported += 1
            now = time.monotonic()
            if now >= self._next_warning:
                self._next_warning = now + self._every_s
                log.warning(
                    "trace export to %s failed (%d batch(es) since the last warning); "
                    "requests are not affected",
                    self._endpoint,
                    self._unreported,
                )
                self._unreported = 0
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self._inner.force_flush(timeout_millis))
