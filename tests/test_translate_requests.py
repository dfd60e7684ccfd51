"""The Anthropic Messages <-> Chat Completions request and whole-answer translators on
recorded shapes of each real API (R-XLATE-1, R-XLATE-2)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pool.translate import chat_via_messages as cvm
from pool.translate import messages_via_chat as mvc
from pool.translate.common import TranslationError

PNG = "iVBORw0KGgo="

# --- Anthropic Messages -> Chat ---------------------------------------------------------------


def test_an_anthropic_request_becomes_a_chat_request_r_xlate_1() -> None:
    """R-XLATE-1: system blocks, mixed text+images (base64 and URL), a tool_use turn, tool
    results (one an error) before the user's text, tools and tool_choice, stop sequences."""
    request = {
        "model": "claude-x",
        "max_tokens": 256,
        "system": [
            {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Compare"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                    },
                    {"type": "image", "source": {"type": "url", "url": "https://x.test/a.jpg"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                    {
                        "type": "tool_use",
                        "id": "toolu_2",
                        "name": "get_weather",
                        "input": {"city": "Rome"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "no data"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "And now?"},
                ],
            },
        ],
        "tools": [
            {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}
        ],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"],
        "temperature": 0.2,
        "metadata": {"user_id": "u-1"},
        "stream": True,
    }
    chat, _ = mvc.chat_request(request, "served")
    assert chat == {
        "temperature": 0.2,
        "max_tokens": 256,
        "stream": True,
        "model": "served",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Compare"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                    {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}},
                ],
            },
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    },
                    {
                        "id": "toolu_2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "[tool error] no data"},
            {"role": "user", "content": "And now?"},
        ],
        "stop": ["END"],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": {"type": "object"},
                    "description": "Weather",
                },
            }
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "user": "u-1",
        "stream_options": {"include_usage": True},
    }


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"container": "c-1"}, "container"),
        ({"mcp_servers": [{"type": "url", "url": "https://x.test"}]}, "mcp_servers"),
        ({"thinking": {"type": "sometimes"}}, "thinking.type"),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
        (  # R-IN-7: an object where a string is expected was a TypeError (a 500)
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": {"a": 1}, "data": "x"},
                            }
                        ],
                    }
                ]
            },
            "messages[0].content[0].source.media_type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages[0].content[0].type",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/tiff",
                                    "data": "x",
                                },
                            }
                        ],
                    }
                ]
            },
            "messages[0].content[0].source.media_type",
        ),
    ],
)
def test_anthropic_fields_without_a_chat_counterpart_are_refused_r_xlate_2(
    change: dict[str, Any], param: str
) -> None:
    """R-XLATE-2: what the provider cannot do and the client relies on is refused naming the
    field (what is only advice is dropped visibly: tests/test_translate_fields.py)."""
    request = {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "x"}],
        **change,
    }
    with pytest.raises(TranslationError) as caught:
        mvc.chat_request(request, "served")
    assert (caught.value.code, caught.value.param) == ("unsupported_operation", param)


def test_a_chat_completion_with_tool_calls_becomes_an_anthropic_message() -> None:
    body = {
        "id": "chatcmpl-abc",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Let me check.",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"a": 1}'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25},
    }
    message = json.loads(mvc.messages_response(json.dumps(body)))
    assert message == {
        "id": "msg_chatcmpl-abc",
        "type": "message",
        "role": "assistant",
        "model": "gpt-4o",
        "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 20, "output_tokens": 5},
    }
    body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = "{bad"  # type: ignore[index]
    with pytest.raises(TranslationError, match="not valid JSON"):
        mvc.messages_response(json.dumps(body))


# --- Chat -> Anthropic Messages ---------------------------------------------------------------


def test_a_chat_request_becomes_an_anthropic_request_r_xlate_1() -> None:
    """R-XLATE-1: system and developer messages join the system prompt; images; parallel
    tool calls and their results as one user turn; limits and choices mapped."""
    request = {
        "model": "gpt-x",
        "messages": [
            {"role": "system", "content": "Rule one."},
            {"role": "developer", "content": [{"type": "text", "text": "Rule two."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look"},
                    {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{PNG}"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"x":1}'},
                    },
                    {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "one"},
            {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "two"}]},
        ],
        "max_completion_tokens": 100,
        "temperature": 0.5,
        "stop": "STOP",
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        ],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "parallel_tool_calls": False,
        "user": "u-9",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert cvm.messages_request(request, "claude-served") == {
        "model": "claude-served",
        "system": "Rule one.\n\nRule two.",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/jpeg", "data": PNG},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "c1", "name": "f", "input": {"x": 1}},
                    {"type": "tool_use", "id": "c2", "name": "f", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "one"},
                    {"type": "tool_result", "tool_use_id": "c2", "content": "two"},
                ],
            },
        ],
        "max_tokens": 100,
        "temperature": 0.5,
        "stop_sequences": ["STOP"],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": True},
        "metadata": {"user_id": "u-9"},
        "stream": True,
    }


@pytest.mark.parametrize(
    ("change", "param", "code"),
    [
        ({"logit_bias": {"1": 2}}, "logit_bias", "unsupported_operation"),
        ({"response_format": {"type": "json_object"}}, "response_format", "unsupported_operation"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}
                ]
            },
            "messages[0].content[0].type",
            "unsupported_operation",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image_url",
                                "image_url": {"url": "data:image/svg+xml;base64,AA"},
                            }
                        ],
                    }
                ]
            },
            "messages[0].content[0].image_url.url",
            "unsupported_operation",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": "[1]"},
                            }
                        ],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
            "invalid_request",
        ),
    ],
)
def test_chat_fields_without_a_messages_counterpart_are_refused_r_xlate_2(
    change: dict[str, Any], param: str, code: str
) -> None:
    """R-XLATE-2: refused naming the field."""
    request = {"model": "m", "messages": [{"role": "user", "content": "x"}], **change}
    with pytest.raises(TranslationError) as caught:
        cvm.messages_request(request, "served")
    assert (caught.value.code, caught.value.param) == (code, param)


def test_an_anthropic_message_becomes_a_chat_completion() -> None:
    message = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [
            {"type": "text", "text": "Sure."},
            {"type": "tool_use", "id": "toolu_9", "name": "f", "input": {"q": "é"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 30, "cache_read_input_tokens": 5, "output_tokens": 12},
    }
    chat = json.loads(cvm.chat_response(json.dumps(message)))
    assert chat["id"] == "chatcmpl-msg_01" and chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Sure.",
        "tool_calls": [
            {
                "id": "toolu_9",
                "type": "function",
                "function": {"name": "f", "arguments": '{"q":"é"}'},
            }
        ],
    }
    assert chat["choices"][0]["finish_reason"] == "tool_calls"
    assert chat["usage"] == {"prompt_tokens": 35, "completion_tokens": 12, "total_tokens": 47}


def test_a_mixed_content_array_with_a_bare_string_is_refused_naming_the_entry() -> None:
    """A content array mixing a bare string with blocks has no reading in either API: 400
    naming the entry, in both directions."""
    anthropic = {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}],
    }
    with pytest.raises(TranslationError) as caught:
        mvc.chat_request(anthropic, "served")
    assert caught.value.param == "messages[0].content[1].type"
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": ["a", {"type": "text", "text": "b"}]}],
    }
    with pytest.raises(TranslationError) as again:
        cvm.messages_request(chat, "served")
    assert again.value.param == "messages[0].content[0].type"
