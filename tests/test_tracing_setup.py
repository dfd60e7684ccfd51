"""R-OBS-2: the SDK starts only from OTEL_*, refuses what it cannot honour, and reports a
failing collector with one warning a minute, never with an error to the request."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult

from obskit.otel import TracingConfigError, check_environment, start_tracing, tracing_requested
from obskit.otel_export import QuietExporter
from tests.support.processes import ROOT, child_env

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}


def test_without_an_endpoint_nothing_starts() -> None:
    """R-OBS-2: no OTLP endpoint, or OTEL_SDK_DISABLED=true, or exporter none: no SDK."""
    assert start_tracing("iop-edge", {}) is None
    assert not tracing_requested({**ENDPOINT, "OTEL_SDK_DISABLED": "true"})
    assert not tracing_requested({**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"})
    assert tracing_requested({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
def test_the_request_path_never_loads_the_sdk_when_tracing_is_off() -> None:
    """R-OBS-2: with OTEL_* unset, the Edge's and the Node's modules load no OpenTelemetry."""
    code = (
        "import sys, django; django.setup();"
        "import pool.http.app, iop_site.server, nodes.agent.cli, nodes.agent.router;"
        "from obskit.otel import start_tracing; assert start_tracing('x') is None;"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    env = child_env({"DJANGO_SETTINGS_MODULE": "iop_site.settings"})
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "name", ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"]
)
def test_a_protocol_other_than_http_protobuf_is_refused_with_its_name(name: str) -> None:
    """A value that would validate nowhere is refused at start, naming the variable."""
    with pytest.raises(TracingConfigError, match=name):
        check_environment({**ENDPOINT, name: "grpc"})
    check_environment({**ENDPOINT, name: "http/protobuf"})


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"},
            "OTEL_TRACES_SAMPLER_ARG",
        ),
        (
            {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"},
            "OTEL_TRACES_SAMPLER_ARG",
        ),
    ],
    ids=["unknown-sampler", "ratio-above-1", "ratio-not-a-number"],
)
def test_a_sampler_the_sdk_would_replace_is_refused(environ: dict[str, str], named: str) -> None:
    """The SDK only warns and samples everything; the Edge and the Node refuse to start."""
    with pytest.raises(TracingConfigError, match=named):
        check_environment({**ENDPOINT, **environ})


@pytest.mark.parametrize("ratio", ["0", "1", "0.25"])
def test_ratios_zero_to_one_are_accepted(ratio: str) -> None:
    check_environment(
        {**ENDPOINT, "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": ratio}
    )


class Failing:
    def __init__(self, raises: bool) -> None:
        self.raises = raises
        self.calls = 0

    def export(self, spans: object) -> SpanExportResult:
        self.calls += 1
        if self.raises:
            raise ConnectionError("refused")
        return SpanExportResult.FAILURE


@pytest.mark.parametrize("raises", [False, True], ids=["failure", "exception"])
def test_export_failures_give_one_warning_a_minute(
    caplog: pytest.LogCaptureFixture, raises: bool
) -> None:
    """R-OBS-2: five failed batches, one warning; nothing is raised to the span processor."""
    exporter = QuietExporter(Failing(raises), "http://collector:4318")
    with caplog.at_level(logging.WARNING, logger="iop.tracing"):
        results = [exporter.export([]) for _ in range(5)]
    assert results == [SpanExportResult.FAILURE] * 5
    assert exporter.failed_batches == 5
    warnings = [r for r in caplog.records if r.name == "iop.tracing"]
    assert len(warnings) == 1 and "http://collector:4318" in warnings[0].getMessage()


@pytest.mark.parametrize(
    ("endpoint", "shown"),
    [
        ("https://user:pw-secret@otel.example:4318/base?token=pw-secret#x",
         "https://otel.example:4318/base"),
        ("http://pw-secret@[::1]:4318", "http://[::1]:4318"),
        ("http://[::1:4318/pw-secret", "(an endpoint that is not a URL)"),
        ("http://h/\x1b[31mred", "'http://h/\\x1b[31mred'"),  # a terminal escape: escaped
    ],
)  # fmt: skip
def test_the_endpoint_a_log_line_shows_has_no_user_info_query_or_raw_control_r_tls_9(
    endpoint, shown
):
    from obskit.otel import shown_endpoint

    assert shown_endpoint(endpoint) == shown
