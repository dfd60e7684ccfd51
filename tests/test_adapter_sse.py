"""Reading usage from relayed SSE, however the text is cut into chunks."""

from __future__ import annotations

import json

import pytest

from nodes import wire
from nodes.agent.adapters.base import usage_from
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


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        (  # OpenAI Chat: the cached tokens are part of prompt_tokens
            [
                {
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 120,
                        "completion_tokens": 5,
                        "prompt_tokens_details": {"cached_tokens": 100},
                    },
                }
            ],
            wire.Usage(input_tokens=120, output_tokens=5, cached_input_tokens=100),
        ),
        (  # Responses: input_tokens_details, on response.completed
            [
                {
                    "type": "response.completed",
                    "response": {
                        "usage": {
                            "input_tokens": 50,
                            "output_tokens": 3,
                            "input_tokens_details": {"cached_tokens": 32},
                        }
                    },
                }
            ],
            wire.Usage(input_tokens=50, output_tokens=3, cached_input_tokens=32),
        ),
        (  # Anthropic: cache reads and writes apart from input_tokens; reads are the cached
            [
                {
                    "type": "message_start",
                    "message": {
                        "usage": {
                            "input_tokens": 9,
                            "cache_read_input_tokens": 200,
                            "cache_creation_input_tokens": 40,
                            "output_tokens": 1,
                        }
                    },
                },
                {"type": "message_delta", "usage": {"output_tokens": 30}},
            ],
            wire.Usage(input_tokens=249, output_tokens=30, cached_input_tokens=200),
        ),
        (  # an upstream that reports none: zero, never a failure
            [
                {
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 7,
                        "completion_tokens": 2,
                        "prompt_tokens_details": None,
                    },
                }
            ],
            wire.Usage(input_tokens=7, output_tokens=2),
        ),
        (  # a figure past the prompt is bounded by it; a bad one counts 0 (R-IN-6)
            [
                {
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 7,
                        "completion_tokens": 2,
                        "prompt_tokens_details": {"cached_tokens": 70},
                    },
                }
            ],
            wire.Usage(input_tokens=7, output_tokens=2, cached_input_tokens=7),
        ),
        (
            [
                {
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 7,
                        "completion_tokens": 2,
                        "prompt_tokens_details": {"cached_tokens": "many"},
                    },
                }
            ],
            wire.Usage(input_tokens=7, output_tokens=2),
        ),
    ],
    ids=["chat", "responses", "anthropic", "none", "past-the-prompt", "not-a-number"],
)
def test_cached_input_tokens_are_read_from_each_upstreams_usage_r_cost_1(events, expected):
    """R-COST-1: where each API reports its prompt-cache reads (FIELD-NOTES "Money"); the
    same figures from a non-stream body (``usage_from``)."""
    stream = "".join(data_event(event) for event in events)
    assert feed_in_pieces(stream, 7).usage == expected
    if "choices" in events[0]:
        assert usage_from(events[0]["usage"]) == expected
