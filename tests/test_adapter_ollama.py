"""The ollama adapter: OpenAI chat in, Ollama /api/chat upstream, OpenAI chat out."""

from __future__ import annotations

import asyncio
import json
import math

import msgspec
import pytest

from nodes import wire
from nodes.agent.adapters.base import AdapterError, RunSpec
from nodes.agent.adapters.ollama import OllamaAdapter
from tests.support.payloads import chat_body, ollama_provider


def spec(body: object, *, stream: bool, operation: str = "chat_completions") -> RunSpec:
    return RunSpec(run_id="r7", operation=operation, stream=stream, body=msgspec.json.encode(body))


def sse_events(text: str) -> list[object]:
    """Parse SSE ``data:`` events; every event must be a complete ``data: ...\\n\\n`` block."""
    assert text.endswith("\n\n")
    events = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def collect(adapter: OllamaAdapter, request: RunSpec) -> tuple[str, wire.Usage | None]:
    parts: list[str] = []
    usage = await adapter.run(request, parts.append)  # a plain (non-async) emit works too
    return "".join(parts), usage


async def test_stream_becomes_openai_chunks_with_usage_and_done(fake_ollama, upstream_client):
    fake_ollama.prompt_eval_count, fake_ollama.eval_count = 19, 8
    adapter = OllamaAdapter(ollama_provider(fake_ollama.url), upstream_client)
    text, usage = await collect(
        adapter, spec(chat_body(model="llama3:8b", stream=True), stream=True)
    )
    events = sse_events(text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert content == fake_ollama.reply_text
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 19, "completion_tokens": 8, "total_tokens": 27}
    assert usage == wire.Usage(input_tokens=19, output_tokens=8)
    assert {c["model"] for c in chunks} == {"llama3:8b"}


async def test_request_is_translated_to_api_chat(fake_ollama, upstream_client):
    adapter = OllamaAdapter(ollama_provider(fake_ollama.url), upstream_client)
    body = {
        "model": "llama3:8b",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is"},
                    {"type": "text", "text": "this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
                ],
            },
        ],
        "temperature": 0.2,
        "max_tokens": 50,
        "stop": ["\n\n"],
        "response_format": {"type": "json_object"},
    }
    await collect(adapter, spec(body, stream=False))
    sent = fake_ollama.requests[0].json
    assert fake_ollama.requests[0].path == "/api/chat"
    assert sent["model"] == "llama3:8b" and sent["stream"] is False
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is\nthis?", "images": ["QUJD"]},
    ]
    assert sent["options"] == {"temperature": 0.2, "num_predict": 50, "stop": ["\n\n"]}
    assert sent["format"] == "json"


async def test_non_stream_returns_one_chat_completion_with_usage(fake_ollama, upstream_client):
    fake_ollama.prompt_eval_count, fake_ollama.eval_count = 4, 6
    adapter = OllamaAdapter(ollama_provider(fake_ollama.url), upstream_client)
    text, usage = await collect(adapter, spec(chat_body(model="llama3:8b"), stream=False))
    reply = json.loads(text)
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"] == {
        "role": "assistant",
        "content": fake_ollama.reply_text,
    }
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["usage"]["prompt_tokens"] == 4 and reply["usage"]["completion_tokens"] == 6
    assert usage == wire.Usage(input_tokens=4, output_tokens=6)


async def test_tool_calls_become_openai_tool_calls(fake_ollama, upstream_client):
    adapter = OllamaAdapter(ollama_provider(fake_ollama.url), upstream_client)
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    text, _ = await collect(adapter, spec(chat_body(stream=True, tools=tools), stream=True))
    chunks = sse_events(text)[:-1]
    calls = [
        c["choices"][0]["delta"]["tool_calls"]
        for c in chunks
        if c["choices"] and "tool_calls" in c["choices"][0]["delta"]
    ]
    assert len(calls) == 1
    call = calls[0][0]
    assert call["index"] == 0 and call["type"] == "function"
    assert call["function"]["name"] == "weather"
    assert json.loads(call["function"]["arguments"]) == fake_ollama.tool_arguments
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert fake_ollama.requests[0].json["tools"] == tools

    text, _ = await collect(adapter, spec(chat_body(tools=tools), stream=False))
    message = json.loads(text)["choices"][0]["message"]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Seoul"}


async def test_ollama_error_status_is_upstream_error(fake_ollama, upstream_client):
    fake_ollama.faults.status = 404
    fake_ollama.faults.error_message = 'model "nope" not found, try pulling it first'
    adapter = OllamaAdapter(ollama_provider(fake_ollama.url), upstream_client)
    with pytest.raises(AdapterError) as err:
        await collect(adapter, spec(chat_body(model="nope", stream=True), stream=True))
    assert (err.value.code, err.value.status) == ("upstream_error", 404)
    assert err.value.message == "upstream returned HTTP 404"
    assert "not found" in err.value.detail


async def test_first_byte_timeout(fake_ollama, upstream_client):
    fake_ollama.faults.stall_before_first_byte = math.inf
    adapter = OllamaAdapter(
        ollama_provider(fake_ollama.url, first_byte_timeout_s=0.3), upstream_client
    )
    with pytest.raises(AdapterError) as err:
        await collect(adapter, spec(chat_body(stream=True), stream=True))
    assert err.value.code == "upstream_timeout"


async def test_stream_ending_without_done_is_an_error(fake_ollama, upstream_client):
    fake_ollama.faults.drop_mid_stream = True
    adapter = OllamaAdapter(ollama_provider(fake_ollama.url), upstream_client)
    with pytest.raises(AdapterError) as err:
        await collect(adapter, spec(chat_body(stream=True), stream=True))
    assert err.value.code == "upstream_error"


async def test_cancel_closes_the_ollama_connection(fake_ollama, upstream_client):
    fake_ollama.faults.stall_mid_stream = math.inf
    adapter = OllamaAdapter(ollama_provider(fake_ollama.url), upstream_client)
    first = asyncio.Event()
    task = asyncio.create_task(
        adapter.run(spec(chat_body(stream=True), stream=True), lambda _t: first.set())
    )
    async with asyncio.timeout(5):
        await first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(5):
        await fake_ollama.disconnected.wait()


async def test_invalid_body_is_bad_request(fake_ollama, upstream_client):
    adapter = OllamaAdapter(ollama_provider(fake_ollama.url), upstream_client)
    request = RunSpec(run_id="r", operation="chat_completions", stream=False, body=b"{nope")
    with pytest.raises(AdapterError) as err:
        await adapter.run(request, lambda _t: None)
    assert err.value.code == "bad_request"
    assert fake_ollama.requests == []
