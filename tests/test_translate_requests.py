"""The request and whole-answer translators on recorded shapes of each real API, admission of
translated operations, and the run channel seen through a translator (R-XLATE-1, 2)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from nodes import wire
from nodes.runs import RunChannel
from pool.http.operations import needs_for
from pool.translate import chat_via_messages as cvm
from pool.translate import messages_via_chat as mvc
from pool.translate import responses_via_chat as rvc
from pool.translate.channel import TranslatedChannel
from pool.translate.common import TranslationError
from pool.translate.messages_via_chat_stream import MessagesViaChatStream
from pool.translate.plan import route, served_capabilities, translated_needs

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
    chat = mvc.chat_request(request, "served")
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
        ({"thinking": {"type": "enabled", "budget_tokens": 2000}}, "thinking"),
        ({"top_k": 3}, "top_k"),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
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
    """R-XLATE-2: refused naming the field, never dropped."""
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


# --- Responses -> Chat ------------------------------------------------------------------------


def test_a_responses_request_becomes_a_chat_request_r_xlate_1() -> None:
    """R-XLATE-1: instructions, message items with images, a function call and its output,
    function tools, a structured output format."""
    request = {
        "model": "r",
        "instructions": "Be kind.",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Hi"},
                    {"type": "input_image", "image_url": "https://x.test/i.png"},
                ],
            },
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": '{"a":1}'},
            {"type": "function_call", "call_id": "call_2", "name": "f", "arguments": '{"a":2}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "r1"},
            {"type": "function_call_output", "call_id": "call_2", "output": "r2"},
        ],
        "tools": [
            {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}
        ],
        "tool_choice": {"type": "function", "name": "f"},
        "max_output_tokens": 50,
        "text": {
            "format": {
                "type": "json_schema",
                "name": "out",
                "schema": {"type": "object"},
                "strict": True,
            }
        },
        "store": False,
    }
    chat = rvc.chat_request(request, "served")
    assert chat["messages"] == [
        {"role": "system", "content": "Be kind."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Hi"},
                {"type": "image_url", "image_url": {"url": "https://x.test/i.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"a":1}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"a":2}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "r1"},
        {"role": "tool", "tool_call_id": "call_2", "content": "r2"},
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object"}, "strict": True},
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["max_tokens"] == 50
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
    }


def test_a_chat_completion_becomes_a_response_with_a_function_call() -> None:
    body = {
        "id": "chatcmpl-7",
        "created": 5,
        "model": "glm-4.6",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_9",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
    }
    response = json.loads(rvc.responses_response(json.dumps(body), rvc.echo_fields({})))
    assert response["id"] == "resp_7" and response["object"] == "response"
    assert response["status"] == "completed"
    assert response["output"] == [
        {
            "id": "fc_call_9",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_9",
            "name": "f",
            "arguments": "{}",
        }
    ]
    assert response["usage"]["total_tokens"] == 6


# --- admission and the translated channel -----------------------------------------------------


def test_r_xlate_1_admission_counts_translations_only_for_translating_groups() -> None:
    """R-XLATE-1, R-PROF-4, R-PROF-7: a GLM profile admits Responses only with translate."""
    glm = served_capabilities({"models", "chat", "streaming", "tool_calling"})
    plain = needs_for("responses", True, False)
    assert not plain <= glm  # translate: false, the original rule: GLM serves no Responses
    assert translated_needs(plain, "responses") <= glm
    assert translated_needs(needs_for("messages", True, True), "messages") <= glm
    ollama = served_capabilities({"models", "chat", "streaming"})
    assert not translated_needs(needs_for("messages", False, True), "messages") <= ollama
    assert route("messages", frozenset({"chat"})) == "messages_via_chat"
    assert route("messages", frozenset({"messages", "chat"})) is None  # native wins
    assert route("count_tokens", frozenset({"chat"})) == "count_tokens_estimate"


async def test_a_translation_failure_ends_the_run_in_the_clients_error() -> None:
    """A failure mid-stream becomes the run's failed end; what follows is dropped."""
    channel = RunChannel("r1", "n1")
    source = TranslatedChannel(channel, stream=MessagesViaChatStream("m"))
    channel.feed('data: {"id":"c","choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n')
    channel.feed('data: {"error":{"message":"kaput"}}\n\n')
    channel.finish(wire.RunEnd(run_id="r1", ok=True))
    first = await asyncio.wait_for(source.get(), 1)
    assert isinstance(first, str) and "message_start" in first and "Hi" in first
    end = source.get_nowait()
    assert isinstance(end, wire.RunEnd) and not end.ok
    assert (
        end.error is not None
        and end.error.code == "upstream_error"
        and "kaput" in end.error.message
    )
    assert source.get_nowait() is None


@pytest.mark.parametrize(
    ("driver", "source", "refused"),
    [
        ("openai_chat", {"type": "url", "url": "https://x.test/a.png"}, False),
        ("ollama", {"type": "base64", "media_type": "image/png", "data": PNG}, False),
        ("ollama", {"type": "url", "url": "https://x.test/a.png"}, True),
        ("cli", {"type": "base64", "media_type": "image/png", "data": PNG}, True),
    ],
)
def test_an_image_the_provider_would_drop_is_refused_r_xlate_2(
    driver: str, source: dict[str, Any], refused: bool
) -> None:
    """R-XLATE-2: Ollama takes base64 images only and a CLI program none: refused, not
    silently dropped on the way."""
    content = [{"type": "text", "text": "see"}, {"type": "image", "source": source}]
    request = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": content}]}
    if not refused:
        mvc.chat_request(request, "served", mvc.images_for(driver))
        return
    with pytest.raises(TranslationError) as caught:
        mvc.chat_request(request, "served", mvc.images_for(driver))
    assert caught.value.param == "messages[0].content[1].source.type"
    responses = {
        "model": "m",
        "input": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "input_image",
                        "image_url": source.get("url") or f"data:image/png;base64,{PNG}",
                    }
                ],
            }
        ],
    }
    with pytest.raises(TranslationError) as again:
        rvc.chat_request(responses, "served", mvc.images_for(driver))
    assert again.value.param == "input[0].content[0].image_url"
