"""A collector that refuses, hangs or fails, and sampling at 0 and 1 (R-OBS-2): requests
through a real Edge and Node are unaffected; each process warns once, not once a batch."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.support import Stack
from tests.support.otlp import OtlpReceiver, tracing_env
from tests.support.ports import free_port

pytestmark = pytest.mark.slow

WARNING = "trace export to"
EXPORT_TIMEOUT_S = 1.0  # OTEL_EXPORTER_OTLP_TIMEOUT: a request waiting on an export would show


def warnings_in(path: Path) -> int:
    return sum(WARNING in line for line in path.read_text().splitlines())


def chat(stack: Stack) -> float:
    """One chat completion through the stack; its latency in seconds."""
    started = time.perf_counter()
    with openai.OpenAI(base_url=stack.v1_url, api_key=stack.token, max_retries=0) as client:
        reply = client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "hi"}], timeout=10
        )
    assert reply.choices[0].message.content
    return time.perf_counter() - started


@pytest.fixture
def failing(request: pytest.FixtureRequest) -> Iterator[tuple[str, OtlpReceiver | None]]:
    mode = request.param
    if mode == "refuse":
        yield f"http://127.0.0.1:{free_port()}", None  # nothing listens there
        return
    receiver = OtlpReceiver(mode)
    yield receiver.endpoint, receiver
    receiver.stop()


@pytest.mark.serial  # every request's latency is held under 1 s: not beside other tests
@pytest.mark.parametrize("failing", ["refuse", "error", "hang"], indirect=True)
def test_a_failing_collector_never_slows_or_fails_a_request_r_obs_2(
    tmp_path: Path, failing: tuple[str, OtlpReceiver | None]
) -> None:
    """R-OBS-2: with the collector refusing, answering 500 or never answering, every request
    succeeds well within the export timeout and each process writes one warning."""
    endpoint, receiver = failing
    env = tracing_env(endpoint, OTEL_EXPORTER_OTLP_TIMEOUT=str(EXPORT_TIMEOUT_S))
    with Stack(tmp_path, env=env) as stack:
        latencies = [chat(stack)]
        deadline = time.monotonic() + 30
        # Several export batches fail (the receiver counts them; a refusing port shows it
        # by the warning), each while more requests run.
        while not (
            warnings_in(stack.dir / "edge.log") >= 1 and (receiver is None or receiver.posts >= 4)
        ):
            assert time.monotonic() < deadline, stack.logs()[-3000:]
            latencies.append(chat(stack))
        latencies += [chat(stack) for _ in range(3)]
        assert max(latencies) < EXPORT_TIMEOUT_S, latencies
        failures = [s for s in stack.metrics() if s.name == "iop_trace_export_failures_total"]
        assert failures and failures[0].value >= 1
        stack.stop()
    assert warnings_in(tmp_path / "edge.log") == 1
    assert warnings_in(tmp_path / "node-1.log") <= 1


@pytest.mark.parametrize("ratio", ["0", "1"])
def test_sampling_ratio_zero_exports_nothing_and_one_everything_r_obs_2(
    tmp_path: Path, ratio: str
) -> None:
    """R-OBS-2: OTEL_TRACES_SAMPLER_ARG=0 exports no span (the upstream still gets an unsampled
    traceparent); 1 exports the Edge's, the run's and the upstream call's span of every
    request. Stopping the stack flushes what was queued."""
    receiver = OtlpReceiver()
    try:
        with Stack(
            tmp_path, env=tracing_env(receiver.endpoint, OTEL_TRACES_SAMPLER_ARG=ratio)
        ) as stack:
            for _ in range(3):
                chat(stack)
            sent = stack.upstream().server.requests
            sampled = {int(r.headers["traceparent"][-2:], 16) & 1 for r in sent}
        if ratio == "0":
            assert sampled == {0} and receiver.spans == []
        else:
            assert sampled == {1}
            services = sorted(s.service for s in receiver.spans)
            assert services == ["iop-edge"] * 3 + ["iop-node"] * 6
    finally:
        receiver.stop()
