"""The Responses -> Chat Completions request and answer translators on recorded shapes,
images a provider would drop, admission of translated operations, and the run channel
seen through a translator (R-XLATE-1, R-XLATE-2)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from nodes import wire
from nodes.runs import RunChannel
from pool.http.operations import needs_for
from pool.translate import messages_via_chat as mvc
from pool.translate import responses_via_chat as rvc
from pool.translate.channel import TranslatedChannel
from pool.translate.common import TranslationError
from pool.translate.fields import Options
from pool.translate.messages_via_chat_stream import MessagesViaChatStream
from pool.translate.plan import route, served_capabilities, translated_needs

PNG = "iVBORw0KGgo="

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
    chat, _ = rvc.chat_request(request, "served")
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
    response = json.loads(
        rvc.responses_response(json.dumps(body), rvc.Answering(rvc.echo_fields({})))
    )
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
        mvc.chat_request(request, "served", Options(images=mvc.images_for(driver)))
        return
    with pytest.raises(TranslationError) as caught:
        mvc.chat_request(request, "served", Options(images=mvc.images_for(driver)))
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
        rvc.chat_request(responses, "served", Options(images=mvc.images_for(driver)))
    assert again.value.param == "input[0].content[0].image_url"
