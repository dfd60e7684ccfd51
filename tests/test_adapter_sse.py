"""Reading usage from relayed SSE, however the text is cut into chunks."""

from __future__ import annotations

import json

from nodes import wire
from nodes.agent.adapters.sse import UsageScanner, data_event


def feed_in_pieces(text: str, size: int) -> UsageScanner:
    scanner = UsageScanner()
    for i in range(0, len(text), size):
        scanner.feed(text[i : i + size])
    scanner.feed("\n")
    return scanner


def test_chat_usage_is_found_whatever_the_chunking():
    stream = (
        data_event({"choices": [{"delta": {"content": "line\u2028sep usage"}}], "usage": None})
        + data_event({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 5}})
        + "data: [DONE]\n\n"
    )
    for size in (1, 3, 7, len(stream)):
        assert feed_in_pieces(stream, size).usage == wire.Usage(input_tokens=12, output_tokens=5)


def test_anthropic_usage_with_crlf_line_endings():
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 9, "output_tokens": 1}}}
    delta = {"type": "message_delta", "usage": {"output_tokens": 30}}
    stream = "".join(f"event: {e['type']}\r\ndata: {json.dumps(e)}\r\n\r\n" for e in (start, delta))
    assert feed_in_pieces(stream, 5).usage == wire.Usage(input_tokens=9, output_tokens=30)


def test_no_usage_in_the_stream_means_none():
    stream = data_event({"choices": [{"delta": {"content": "hi"}}]}) + "data: [DONE]\n\n"
    assert feed_in_pieces(stream, 4).usage is None


def test_data_events_escape_line_separators():
    assert "\u2028" not in data_event({"text": "a\u2028b"})
