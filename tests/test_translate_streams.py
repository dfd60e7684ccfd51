"""The stream translators on recorded shapes of each real API (R-XLATE-1): Chat chunks with
parallel tool calls and streamed argument deltas, Anthropic events with ``ping`` and
``message_delta`` usage, and the Responses events ending in ``response.completed``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pool.translate.chat_via_messages_stream import ChatViaMessagesStream
from pool.translate.common import SseReader, TranslationError
from pool.translate.messages_via_chat_stream import MessagesViaChatStream
from pool.translate.responses_via_chat import Answering
from pool.translate.responses_via_chat_stream import ResponsesViaChatStream


def sse(*events: dict[str, Any], named: bool = False) -> str:
    out = []
    for event in events:
        head = f"event: {event['type']}\n" if named else ""
        out.append(head + "data: " + json.dumps(event) + "\n\n")
    return "".join(out)


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        "object": "chat.completion.chunk",
        "created": 1741570283,
        "model": "gpt-4o-2024-08-06",
        "system_fingerprint": "fp_eb9dce56a8",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        **extra,
    }


def call_delta(index: int, arguments: str, call_id: str | None = None) -> dict[str, Any]:
    fn: dict[str, Any] = {"arguments": arguments}
    entry: dict[str, Any] = {"index": index, "function": fn}
    if call_id is not None:
        entry.update(id=call_id, type="function")
        fn["name"] = "get_weather"
    return entry


# A Chat Completions stream as the API sends it: parallel tool calls, arguments in
# fragments, finish_reason, then (stream_options.include_usage) the usage chunk and [DONE].
CHAT_TOOLS_STREAM = (
    sse(
        chunk({"role": "assistant", "content": None, "refusal": None}),
        chunk({"tool_calls": [call_delta(0, "", "call_DdmO9pD3xa9XTPNJ32zg2hcA")]}),
        chunk({"tool_calls": [call_delta(0, '{"lo')]}),
        chunk({"tool_calls": [call_delta(0, 'cation": "Paris"}')]}),
        chunk({"tool_calls": [call_delta(1, "", "call_ABCDEF")]}),
        chunk({"tool_calls": [call_delta(1, '{"location": "Rome"}')]}),
        chunk({}, "tool_calls"),
        {
            "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
            "object": "chat.completion.chunk",
            "created": 1741570283,
            "model": "gpt-4o-2024-08-06",
            "choices": [],
            "usage": {"prompt_tokens": 82, "completion_tokens": 48, "total_tokens": 130},
        },
    )
    + "data: [DONE]\n\n"
)

CHAT_TEXT_STREAM = (
    sse(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hello"}),
        chunk({"content": " there\u2028!"}),
        chunk({}, "stop"),
        {**chunk({}), "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}},
    )
    + "data: [DONE]\n\n"
)

# An Anthropic stream as the API sends it (docs: "Streaming Messages", tool use).
ANTHROPIC_TOOL_STREAM = sse(
    {
        "type": "message_start",
        "message": {
            "id": "msg_014p7gG3wDgGV9EUtLvnow3U",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "stop_sequence": None,
            "usage": {
                "input_tokens": 472,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 10,
                "output_tokens": 2,
            },
            "content": [],
            "stop_reason": None,
        },
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "ping"},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Okay"}},
    {"type": "content_block_stop", "index": 0},
    {
        "type": "content_block_start",
        "index": 1,
        "content_block": {
            "type": "tool_use",
            "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
            "name": "get_weather",
            "input": {},
        },
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": ""},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '{"location": "San Fra'},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": 'ncisco, CA"}'},
    },
    {"type": "content_block_stop", "index": 1},
    {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"input_tokens": 472, "output_tokens": 89},
    },
    {"type": "message_stop"},
    named=True,
)


def events(text: str) -> list[dict[str, Any]]:
    """The JSON data of each SSE event (``[DONE]`` kept as the string)."""
    out: list[dict[str, Any]] = []
    for data in SseReader().feed(text):
        out.append(json.loads(data) if data != "[DONE]" else {"type": "[DONE]"})
    return out


def run(translator: Any, text: str, step: int = 0) -> str:
    """Feed ``text`` whole, or in pieces of ``step`` characters (splits mid-line)."""
    if not step:
        return str(translator.feed(text) + translator.close())
    parts = [translator.feed(text[i : i + step]) for i in range(0, len(text), step)]
    return "".join(parts) + str(translator.close())


# --- Chat -> Anthropic events -----------------------------------------------------------------


@pytest.mark.parametrize("step", [0, 1, 7])
def test_chat_tool_stream_becomes_anthropic_events_r_xlate_1(step: int) -> None:
    """R-XLATE-1: parallel calls become two tool_use blocks, argument fragments become
    input_json_delta in order, usage arrives in message_delta; any split gives one result."""
    out = run(MessagesViaChatStream("m"), CHAT_TOOLS_STREAM, step)
    got = events(out)
    assert [e["type"] for e in got] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert out.startswith("event: message_start\n")
    starts = [e for e in got if e["type"] == "content_block_start"]
    assert [s["content_block"]["id"] for s in starts] == [
        "call_DdmO9pD3xa9XTPNJ32zg2hcA",
        "call_ABCDEF",
    ]
    joined: dict[int, str] = {}
    for e in got:
        if e["type"] == "content_block_delta":
            joined[e["index"]] = joined.get(e["index"], "") + e["delta"]["partial_json"]
    assert {i: json.loads(v) for i, v in joined.items()} == {
        0: {"location": "Paris"},
        1: {"location": "Rome"},
    }
    delta = got[-2]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"] == {"input_tokens": 82, "output_tokens": 48}


def test_chat_text_stream_becomes_text_deltas_with_end_turn() -> None:
    got = events(run(MessagesViaChatStream("m"), CHAT_TEXT_STREAM))
    text = "".join(e["delta"]["text"] for e in got if e["type"] == "content_block_delta")
    assert text == "Hello there\u2028!"
    assert got[-2]["delta"]["stop_reason"] == "end_turn"


def test_chat_stream_without_a_finish_reason_is_an_error() -> None:
    """A stream that ends before its stop event is never a silent truncation."""
    translator = MessagesViaChatStream("m")
    translator.feed(sse(chunk({"content": "Hel"})))
    with pytest.raises(TranslationError, match="before its stop event"):
        translator.close()


def test_an_in_band_chat_error_is_raised() -> None:
    translator = MessagesViaChatStream("m")
    with pytest.raises(TranslationError, match="boom") as caught:
        translator.feed(sse(chunk({"content": "a"}), {"error": {"message": "boom"}}))
    assert caught.value.code == "upstream_error"


def test_streamed_tool_arguments_that_are_not_json_are_an_error() -> None:
    translator = MessagesViaChatStream("m")
    bad = sse(
        chunk({"tool_calls": [call_delta(0, '{"city": Par', "call_1")]}), chunk({}, "tool_calls")
    )
    with pytest.raises(TranslationError, match="not valid JSON"):
        translator.feed(bad + "data: [DONE]\n\n")


# --- Anthropic -> Chat chunks -----------------------------------------------------------------


@pytest.mark.parametrize("step", [0, 3])
def test_anthropic_tool_stream_becomes_chat_chunks_r_xlate_1(step: int) -> None:
    """R-XLATE-1: text and tool_use blocks become content and tool_calls deltas; ping is
    skipped; message_delta usage (with cache reads) becomes the usage chunk; then [DONE]."""
    got = events(run(ChatViaMessagesStream("m", include_usage=True), ANTHROPIC_TOOL_STREAM, step))
    assert got[-1] == {"type": "[DONE]"}
    chunks = got[:-1]
    assert {c["id"] for c in chunks} == {"chatcmpl-msg_014p7gG3wDgGV9EUtLvnow3U"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Okay"
    calls = [
        tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert calls[0] == {
        "index": 0,
        "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    arguments = "".join(tc["function"]["arguments"] for tc in calls)
    assert json.loads(arguments) == {"location": "San Francisco, CA"}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 482,
        "completion_tokens": 89,
        "total_tokens": 571,
    }


def test_anthropic_stream_without_include_usage_has_no_usage_chunk() -> None:
    got = events(run(ChatViaMessagesStream("m", include_usage=False), ANTHROPIC_TOOL_STREAM))
    assert all("usage" not in c for c in got[:-1])


def test_anthropic_error_event_and_missing_message_stop_are_errors() -> None:
    failing = ChatViaMessagesStream("m", include_usage=False)
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    with pytest.raises(TranslationError, match="Overloaded"):
        failing.feed(
            ANTHROPIC_TOOL_STREAM.split("event: message_delta")[0] + sse(error, named=True)
        )
    cut = ChatViaMessagesStream("m", include_usage=False)
    cut.feed(ANTHROPIC_TOOL_STREAM.split("event: message_stop")[0])
    with pytest.raises(TranslationError, match="before its stop event"):
        cut.close()


# --- Chat -> Responses events -----------------------------------------------------------------


ECHO = {"instructions": None, "tools": [], "tool_choice": "auto", "parallel_tool_calls": True}


def test_chat_text_stream_becomes_responses_events_r_xlate_1() -> None:
    """R-XLATE-1: the documented event sequence with rising sequence numbers, ending with
    response.completed that carries the whole output and usage."""
    got = events(run(ResponsesViaChatStream("m", Answering(ECHO)), CHAT_TEXT_STREAM))
    assert [e["type"] for e in got] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert got[0]["response"]["status"] == "in_progress" and got[0]["response"]["output"] == []
    item_id = got[2]["item"]["id"]
    assert {e.get("item_id", item_id) for e in got[3:9]} == {item_id}
    done = got[-1]["response"]
    assert done["id"] == got[0]["response"]["id"] and done["status"] == "completed"
    assert done["output"][0]["content"][0]["text"] == "Hello there\u2028!"
    assert done["usage"]["input_tokens"] == 9 and done["usage"]["output_tokens"] == 3


def test_chat_tool_stream_becomes_function_call_items_r_xlate_1() -> None:
    """R-XLATE-1: each parallel call is a function_call item with argument deltas and done."""
    got = events(run(ResponsesViaChatStream("m", Answering(ECHO)), CHAT_TOOLS_STREAM, 5))
    added = [e["item"] for e in got if e["type"] == "response.output_item.added"]
    assert [(i["type"], i["call_id"]) for i in added] == [
        ("function_call", "call_DdmO9pD3xa9XTPNJ32zg2hcA"),
        ("function_call", "call_ABCDEF"),
    ]
    arguments_done = [
        e["arguments"] for e in got if e["type"] == "response.function_call_arguments.done"
    ]
    assert [json.loads(a) for a in arguments_done] == [{"location": "Paris"}, {"location": "Rome"}]
    deltas = [e["delta"] for e in got if e["type"] == "response.function_call_arguments.delta"]
    assert "".join(deltas) == "".join(arguments_done)
    final = got[-1]["response"]
    assert [o["id"] for o in final["output"]] == [i["id"] for i in added]


def test_a_length_finish_is_an_incomplete_response() -> None:
    text = sse(chunk({"content": "a"}), chunk({}, "length")) + "data: [DONE]\n\n"
    got = events(run(ResponsesViaChatStream("m", Answering(ECHO)), text))
    assert got[-1]["type"] == "response.incomplete"
    assert got[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_failure_ends_a_responses_stream_with_response_failed_r_xlate_1() -> None:
    """R-XLATE-1: the Responses API's own end of a failed stream, with the output so far and
    the next sequence number; nothing after it, and nothing once the stream has ended."""
    translator = ResponsesViaChatStream("m", Answering(ECHO))
    started = events(translator.feed(sse(chunk({"role": "assistant"}), chunk({"content": "a"}))))
    failed = events(translator.failed("upstream_error", "the upstream stopped"))
    assert [e["type"] for e in failed] == ["response.failed"]
    assert failed[0]["sequence_number"] == started[-1]["sequence_number"] + 1
    response = failed[0]["response"]
    assert response["id"] == started[0]["response"]["id"] and response["status"] == "failed"
    assert response["error"] == {"code": "upstream_error", "message": "the upstream stopped"}
    assert [item["type"] for item in response["output"]] == ["message"]
    assert translator.failed("upstream_error", "again") == ""
    assert translator.feed(sse(chunk({"content": "late"}))) == ""
    done = ResponsesViaChatStream("m", Answering(ECHO))
    run(done, CHAT_TEXT_STREAM)
    assert done.failed("upstream_error", "after the end") == ""


def test_sse_reader_handles_crlf_comments_and_multiline_data() -> None:
    reader = SseReader()
    assert reader.feed(': ping\r\n\r\nevent: x\r\ndata: {"a":\r\ndata: 1}\r\n') == []
    assert reader.feed("\r\n") == ['{"a":\n1}']
