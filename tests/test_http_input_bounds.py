"""What the surface makes of hostile or oversized input, in process (R-IN-3, R-IN-4):
malformed bodies are 400 ``invalid_request`` with no traceback; images count a fixed cost;
a request no provider could ever hold is 400 ``context_length_exceeded``."""

from __future__ import annotations

import base64
import logging
from typing import Any

import msgspec
import pytest

from pool.http.app import OpenAIApp
from pool.http.operations import BINARY_PART_TOKENS, estimate_tokens
from tests.support.inprocess import FakeNode, Runtime, api, chat, document

MIB = 1024 * 1024


def image_chat(image_bytes: int, model: str = "gpt") -> dict[str, Any]:
    image = base64.b64encode(b"\x89PNG" + bytes(image_bytes)).decode()
    content = [
        {"type": "text", "text": "what is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + image}},
    ]
    return {"model": model, "messages": [{"role": "user", "content": content}]}


def text_chat(tokens: int, model: str = "gpt") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "abcd" * tokens}]}


async def edge_with(**changes: Any) -> tuple[OpenAIApp, Runtime, FakeNode]:
    doc = document(long_context_threshold_tokens=4000, max_request_bytes=8 * MIB)
    provider = doc["nodes"][0]["providers"][0]  # p-open: window 8192, one long slot
    provider.update(changes)
    runtime = Runtime(doc)
    node = await FakeNode(runtime.hub).start()
    return OpenAIApp(runtime), runtime, node


@pytest.fixture
async def edge() -> Any:
    app, runtime, node = await edge_with()
    yield app, runtime, node
    await runtime.hub.aclose()
    assert runtime.pool.idle()


def test_r_in_4_an_image_part_counts_a_fixed_cost_not_its_base64_length() -> None:
    """R-IN-4: each of the API shapes of a binary part, and a bare data URL."""
    payload = "A" * 400_000
    shapes: list[Any] = [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + payload}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": payload}},
        {"type": "input_image", "image_url": "data:image/png;base64," + payload},
        {"type": "input_file", "file_data": payload},
        {"type": "input_audio", "input_audio": {"data": payload, "format": "wav"}},
        {"text": "data:application/pdf;base64," + payload},
    ]
    for shape in shapes:
        data = {"model": "m", "messages": [{"role": "user", "content": [shape]}]}
        body = msgspec.json.encode(data)
        estimate = estimate_tokens(body, data)
        assert BINARY_PART_TOKENS <= estimate < BINARY_PART_TOKENS + 100, shape
    text = {"model": "m", "messages": [{"role": "user", "content": payload}]}
    assert estimate_tokens(msgspec.json.encode(text), text) > len(payload) // 4


async def test_r_in_4_a_6_mib_image_request_is_admitted_as_a_normal_request(edge: Any) -> None:
    """R-IN-4: not 503 (bytes / 4 made it ~1.5M tokens: a long request over every window)."""
    app, _, node = edge
    call = await api(app, "POST", "/v1/chat/completions", image_chat(4_500_000)).done()
    assert call.status == 200, call.body
    assert len(node.runs) == 1 and len(node.runs[0].body) > 5 * MIB


async def test_r_in_4_a_request_over_every_context_window_is_a_400(edge: Any) -> None:
    """R-IN-4: 10k tokens against a largest window of 8192: never retryable, so not a 503."""
    app, _, node = edge
    call = await api(app, "POST", "/v1/chat/completions", text_chat(10_000)).done()
    assert call.status == 400
    error = call.json()["error"]
    assert (error["code"], error["type"], error["param"]) == (
        "context_length_exceeded",
        "invalid_request_error",
        "messages",
    )
    assert node.runs == []


async def test_r_in_4_a_long_request_where_no_provider_has_long_slots_is_a_400(
    edge: Any,
) -> None:
    """R-IN-4: the ``local`` group's only provider has no long-context slots."""
    app, _, node = edge
    call = await api(app, "POST", "/v1/chat/completions", text_chat(5000, "local")).done()
    assert call.status == 400 and call.json()["error"]["code"] == "context_length_exceeded"
    anthropic = api(app, "POST", "/v1/messages", {**text_chat(5000, "claude"), "max_tokens": 5})
    call = await anthropic.done()
    assert call.status == 400 and call.json()["error"]["type"] == "invalid_request_error"
    assert node.runs == []


async def test_r_in_4_a_long_request_whose_long_provider_is_disabled_is_a_503() -> None:
    """R-IN-4: the provider that could hold it exists but is disabled: retryable, 503."""
    app, runtime, node = await edge_with(enabled=False)
    call = await api(app, "POST", "/v1/chat/completions", text_chat(5000)).done()
    assert call.status == 503 and call.json()["error"]["code"] == "no_available_provider"
    assert node.runs == []
    await runtime.hub.aclose()


MALFORMED = {
    "deep_nesting": b'{"model":"gpt","messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "deep_objects": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "invalid_utf8": b'{"model":"gpt","messages":[{"role":"user","content":"\xff\xfe"}]}',
    "top_level_array": b'[{"model":"gpt"}]',
    "top_level_string": b'"gpt"',
    "messages_not_a_list": b'{"model":"gpt","messages":{"role":"user"}}',
    "model_a_number": b'{"model":7,"messages":[{"role":"user","content":"hi"}]}',
    "stream_a_string": b'{"model":"gpt","stream":"yes","messages":[{"role":"user"}]}',
    "truncated": b'{"model":"gpt","messages":[',
    "empty": b"",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
async def test_r_in_3_malformed_bodies_are_400_invalid_request_without_a_traceback(
    edge: Any, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """R-IN-3: nesting depth, invalid UTF-8, wrong types, non-object top level."""
    app, _, node = edge
    with caplog.at_level(logging.WARNING):
        call = await api(app, "POST", "/v1/chat/completions", MALFORMED[name]).done()
    assert call.status == 400, call.body
    assert call.json()["error"]["code"] == "invalid_request"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert node.runs == []


async def test_r_in_3_unchanged_small_requests_still_pass(edge: Any) -> None:
    app, _, _ = edge
    call = await api(app, "POST", "/v1/chat/completions", chat()).done()
    assert call.status == 200
