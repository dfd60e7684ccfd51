"""One request seen across the hop (R-OBS-1, R-OBS-2, R-OBS-4): a real Edge and Node exporting
OTLP to a receiver in the test, the official OpenAI SDK as the client, a loopback upstream."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support import Stack
from tests.support.otlp import OtlpReceiver, Span, tracing_env

pytestmark = pytest.mark.slow

CANARY_PROMPT = "canary-prompt-9d41c7 tell me nothing"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN}-01"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    running = OtlpReceiver()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver) -> Iterator[Stack]:
    with Stack(tmp_path_factory.mktemp("obs"), env=tracing_env(receiver.endpoint)) as running:
        yield running


@pytest.fixture(autouse=True)
def idle_after(stack: Stack) -> Iterator[None]:
    with stack.clean_slate():
        yield


def spans_of(receiver: OtlpReceiver, trace_id: str, count: int) -> list[Span]:
    """The spans of one trace, once ``count`` of them have arrived."""
    spans = receiver.wait_for(
        lambda got: len([s for s in got if s.trace_id == trace_id]) >= count,
        what=f"{count} spans of trace {trace_id}",
    )
    return [s for s in spans if s.trace_id == trace_id]


def one(spans: list[Span], service: str, kind: int | None = None) -> Span:
    found = [s for s in spans if s.service == service and (kind is None or s.kind == kind)]
    assert len(found) == 1, [(s.service, s.name, s.kind) for s in spans]
    return found[0]


def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a process's output, each parsed as JSON (fails on any plain line)."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    assert lines, f"{path} is empty"
    return [json.loads(line) for line in lines]


SERVER, INTERNAL, CLIENT = 2, 1, 3  # OTLP span kinds


def test_one_trace_from_the_callers_traceparent_to_the_upstream_r_obs_2(
    stack: Stack, receiver: OtlpReceiver, oai: openai.OpenAI
) -> None:
    """R-OBS-2: the caller's trace continues on the Edge, the Node's run, its upstream call
    and the upstream's received header; GenAI attributes and token counts are on the spans,
    the prompt and the completion are on none."""
    raw = oai.chat.completions.with_raw_response.create(
        model="gpt-test",
        messages=[{"role": "user", "content": CANARY_PROMPT}],
        stream=True,
        extra_headers={"traceparent": TRACEPARENT, "x-request-id": "obs-e2e-1"},
    )
    assert raw.headers["x-request-id"] == "obs-e2e-1"
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert text == stack.upstream().server.reply_text

    spans = spans_of(receiver, TRACE_ID, 3)
    edge, run = one(spans, "iop-edge", SERVER), one(spans, "iop-node", INTERNAL)
    call = one(spans, "iop-node", CLIENT)
    assert edge.parent_span_id == PARENT_SPAN
    assert run.parent_span_id == edge.span_id
    assert call.parent_span_id == run.span_id
    (sent,) = stack.upstream().server.requests
    assert sent.headers["traceparent"] == f"00-{TRACE_ID}-{call.span_id}-01"
    assert sent.headers["x-request-id"] == "obs-e2e-1"

    upstream = stack.upstream().server
    assert edge.attributes["gen_ai.operation.name"] == "chat"
    assert edge.attributes["gen_ai.request.model"] == "gpt-test"
    assert edge.attributes["gen_ai.response.model"] == "served-gpt"
    assert edge.attributes["gen_ai.usage.input_tokens"] == upstream.prompt_tokens
    assert edge.attributes["gen_ai.usage.output_tokens"] == upstream.completion_tokens
    assert edge.attributes["iop.provider"] == "p-openai"
    assert edge.attributes["iop.node"] == "node-1"
    assert edge.attributes["iop.principal"] == "team-test"
    assert edge.attributes["iop.request_id"] == "obs-e2e-1"
    assert edge.attributes["iop.admission"] == "admitted"
    assert edge.attributes["iop.admissions"] == 1
    assert edge.attributes["iop.queue_wait_ms"] >= 0
    assert run.attributes["gen_ai.request.model"] == "served-gpt"
    assert run.attributes["gen_ai.usage.output_tokens"] == upstream.completion_tokens
    assert run.attributes["iop.provider"] == "p-openai"
    assert run.attributes["iop.node"] == "node-1"
    assert call.attributes["http.response.status_code"] == 200
    for span in receiver.spans:
        assert b"canary-prompt-9d41c7" not in span.raw
        assert upstream.reply_text.split(",")[0].encode() not in span.raw


def test_ids_reach_the_response_both_logs_and_the_request_log_r_obs_1_r_obs_4(
    stack: Stack, oai: openai.OpenAI
) -> None:
    """R-OBS-1, R-OBS-4: a failing request's id is on its answer, on JSON lines of the Edge
    and of the Node, and on its request-log row; every line either process wrote is JSON."""
    stack.upstream().server.faults.status = 500
    with pytest.raises(openai.InternalServerError) as failed:
        oai.chat.completions.create(
            model="gpt-test",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-request-id": "obs-e2e-fail"},
        )
    assert failed.value.response.headers["x-request-id"] == "obs-e2e-fail"
    (sent,) = stack.upstream().server.requests
    assert sent.headers["x-request-id"] == "obs-e2e-fail"

    edge_lines = json_lines(stack.dir / "edge.log")
    node_lines = json_lines(stack.dir / "node-1.log")
    for line in edge_lines + node_lines:
        assert set(line) >= {"time", "level", "logger", "message", "request_id", "run_id",
                             "trace_id", "node", "provider"}  # fmt: skip
    assert any("IOP Edge ready" in line["message"] for line in edge_lines)
    edge_about = [line for line in edge_lines if line["request_id"] == "obs-e2e-fail"]
    assert edge_about and all(line["trace_id"] for line in edge_about)
    assert {(line["node"], line["provider"]) for line in edge_about} == {("node-1", "p-openai")}
    assert all(line["run_id"] for line in edge_about)
    node_about = [line for line in node_lines if line["request_id"] == "obs-e2e-fail"]
    assert node_about, node_lines[-5:]
    assert {line["node"] for line in node_about} == {"node-1"}
    assert {line["provider"] for line in node_about} == {"p-openai"}
    assert all(line["run_id"] for line in node_about)

    row = wait_for_row(stack, "obs-e2e-fail")
    assert row["status"] == 502 and row["code"] == "upstream_error"
    assert row["model_group"] == "gpt-test" and row["provider"] == "p-openai"
    assert row["node"] == "node-1" and row["principal_ref"] == "team-test"
    assert len(row["trace_id"]) == 32


def wait_for_row(stack: Stack, request_id: str, within: float = 20.0) -> dict[str, Any]:
    """The request-log row of ``request_id`` in the Edge's database, once the meter wrote it."""
    deadline = time.monotonic() + within
    while True:
        with sqlite3.connect(stack.dir / "edge.sqlite3") as db:
            db.row_factory = sqlite3.Row
            row = db.execute(
                "SELECT * FROM pool_requestlogentry WHERE request_id = ?", (request_id,)
            ).fetchone()
        if row is not None:
            return dict(row)
        assert time.monotonic() < deadline, f"no request-log row for {request_id}"
        time.sleep(0.1)


@pytest.mark.parametrize(
    "value",
    ["x" * 10_000, "has space", "x" * 129, "semi;colon"],
    ids=["10kB", "space", "129", "semicolon"],
)
def test_an_odd_request_id_is_replaced_never_echoed_r_obs_1(stack: Stack, value: str) -> None:
    """R-OBS-1: an x-request-id that is too long or holds other characters is replaced."""
    response, _ = _post_with_request_id(stack, value)
    assert response.status == 200
    given = response.getheader("x-request-id")
    assert given is not None and given != value
    assert len(given) == 24 and all(c in "0123456789abcdef" for c in given)
    (sent,) = stack.upstream().server.requests
    assert sent.headers["x-request-id"] == given


def test_a_control_character_in_a_header_is_a_bad_request_with_a_new_id_r_obs_1(
    stack: Stack,
) -> None:
    """A header value holding a control character is not HTTP (RFC 9110, 5.5): the public
    listener answers 400 ``invalid_request`` in the API's shape, with a new request id, and
    nothing reaches an upstream."""
    response, body = _post_with_request_id(stack, "bell\x07char")
    assert response.status == 400
    assert json.loads(body)["error"]["code"] == "invalid_request"
    given = response.getheader("x-request-id")
    assert given is not None and len(given) == 24 and "bell" not in given
    assert stack.upstream().server.requests == []


def _post_with_request_id(stack: Stack, value: str) -> tuple[Any, bytes]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", stack.ports["openai"], timeout=10)
    conn.putrequest("POST", "/v1/chat/completions")
    conn.putheader("Authorization", f"Bearer {stack.token}")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("X-Request-Id", value)
    body = b'{"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}'
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    try:
        response = conn.getresponse()
        return response, response.read()
    finally:
        conn.close()


@pytest.mark.parametrize(
    "traceparent",
    [
        "00-xyz-00f067aa0ba902b7-01",
        f"00-{TRACE_ID}-{PARENT_SPAN}-01-" + "a" * 4000,
        f"00-{'0' * 32}-{PARENT_SPAN}-01",
        f"00-{TRACE_ID.upper()}-{PARENT_SPAN}-01",
    ],
    ids=["malformed", "too-long", "zero-trace", "upper-case"],
)
def test_a_bad_traceparent_starts_a_new_trace_r_obs_2(
    stack: Stack, receiver: OtlpReceiver, oai: openai.OpenAI, traceparent: str
) -> None:
    """R-OBS-2: a malformed or too long traceparent is ignored: the request gets a new trace."""
    raw = oai.chat.completions.with_raw_response.create(
        model="gpt-test",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"traceparent": traceparent},
    )
    request_id = raw.headers["x-request-id"]

    def edge_spans(got: list[Span]) -> list[Span]:
        return [s for s in got if s.attributes.get("iop.request_id") == request_id
                and s.service == "iop-edge"]  # fmt: skip

    (edge,) = edge_spans(receiver.wait_for(edge_spans, what="the Edge's span"))
    assert edge.trace_id != TRACE_ID and edge.parent_span_id == ""
    (sent,) = stack.upstream().server.requests
    assert sent.headers["traceparent"].split("-")[1] == edge.trace_id
