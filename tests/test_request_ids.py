"""R-OBS-1 at the Edge's door, in process: every /v1 answer carries x-request-id, the id and
the caller's trace context travel in the run message, and the meter gets them."""

from __future__ import annotations

from typing import Any

import pytest

from pool.http.app import OpenAIApp
from tests.support.inprocess import FakeNode, Runtime, api, chat, document

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
async def edge() -> Any:
    doc = document()
    doc["openai"]["principal_tokens"][0]["rpm"] = 2
    runtime = Runtime(doc)
    node = await FakeNode(runtime.hub).start()
    yield OpenAIApp(runtime), runtime, node
    await runtime.hub.aclose()
    assert runtime.pool.idle()


def is_new_id(value: bytes) -> bool:
    return len(value) == 24 and all(c in b"0123456789abcdef" for c in value)


async def test_every_kind_of_answer_carries_a_request_id_r_obs_1(edge: Any) -> None:
    """R-OBS-1: whole, streamed, 401, 404, 405, 400 and 429 answers all carry x-request-id."""
    app, _, _ = edge
    calls = [
        api(app, "POST", "/v1/chat/completions", chat()),
        api(app, "POST", "/v1/chat/completions", chat(stream=True)),
        api(app, "POST", "/v1/chat/completions", chat(), token="wrong"),
        api(app, "POST", "/v1/nothing-here", chat()),
        api(app, "GET", "/v1/chat/completions"),
        api(app, "POST", "/v1/chat/completions", b"{not json"),
        api(app, "POST", "/v1/chat/completions", chat()),  # the third within rpm=2
    ]
    statuses = []
    for call in calls:
        await call.done()
        statuses.append(call.status)
        assert is_new_id(call.headers[b"x-request-id"]), call.headers
    assert statuses == [200, 200, 401, 404, 405, 400, 429]
    assert len({call.headers[b"x-request-id"] for call in calls}) == len(calls)


async def test_the_callers_id_and_trace_travel_with_the_run_and_reach_the_meter(
    edge: Any,
) -> None:
    """R-OBS-1, R-OBS-2: a valid caller id is kept; without tracing the caller's traceparent
    is passed on unchanged; the meter's record names the request, its trace and timings."""
    app, runtime, node = edge
    headers = {"x-request-id": "caller-id_1.2:3", "traceparent": TRACEPARENT}
    call = await api(app, "POST", "/v1/chat/completions", chat(stream=True), headers=headers).done()
    assert call.headers[b"x-request-id"] == b"caller-id_1.2:3"
    (run,) = node.runs
    assert (run.request_id, run.traceparent) == ("caller-id_1.2:3", TRACEPARENT)
    (record,) = runtime.meter.records
    assert record.request_id == "caller-id_1.2:3"
    assert record.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert record.node_id == "n1"
    assert record.queue_wait_s is not None and 0 <= record.queue_wait_s < record.duration_s
    assert record.ttft_s is not None and record.queue_wait_s <= record.ttft_s <= record.duration_s


@pytest.mark.parametrize(
    "value",
    ["x" * 10_000, "has space", "tab\there", "x" * 129, "\u00e9t\u00e9"],
    ids=["10kB", "space", "control", "129", "non-ascii"],
)
async def test_an_odd_request_id_is_replaced_r_obs_1(edge: Any, value: str) -> None:
    """R-OBS-1: an id that is too long or holds other characters is replaced, never echoed."""
    app, _, node = edge
    call = await api(
        app, "POST", "/v1/chat/completions", chat(), headers={"x-request-id": value}
    ).done()
    given = call.headers[b"x-request-id"]
    assert is_new_id(given)
    assert node.runs[0].request_id == given.decode()


async def test_a_request_id_of_exactly_128_allowed_characters_is_kept(edge: Any) -> None:
    """R-OBS-1: the bound is inclusive."""
    app, _, _ = edge
    value = ("aZ09._:-" * 16)[:128]
    call = await api(
        app, "POST", "/v1/chat/completions", chat(), headers={"x-request-id": value}
    ).done()
    assert call.headers[b"x-request-id"] == value.encode()
