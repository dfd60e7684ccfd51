"""The official ``openai`` SDK through a real Edge and Node by translation (R-XLATE-1): Chat
Completions against an Anthropic Messages provider, Responses against a Chat Completions
provider (GLM, which has no Responses of its own: R-PROF-7); refusals (R-XLATE-2) and
broken streams end in the OpenAI error shape with no lease held (R-POOL-9)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from pool.http.errors import ERRORS
from tests.support import Stack
from tests.support.translation import PROVIDER_KEY, metric, translation_stack

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
RESPONSES_WEATHER = {"type": "function", **WEATHER["function"]}  # type: ignore[dict-item]
PNG_URL = "data:image/png;base64,iVBORw0KGgo="


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with translation_stack(tmp_path_factory.mktemp("xlate-oai")) as running:
        running.upstream("claude").server.api_key = PROVIDER_KEY
        yield running


@pytest.fixture(autouse=True)
def idle_after(stack: Stack) -> Iterator[None]:
    stack.reset_upstreams()
    yield
    stack.wait_idle()  # R-POOL-9: no lease held, however the request ended


def claude_requests(stack: Stack) -> list[Any]:
    return [r for r in stack.upstream("claude").server.requests if r.path == "/v1/messages"]


def glm_requests(stack: Stack) -> list[Any]:
    return [
        r.json
        for r in stack.upstream("main").server.requests
        if r.path == "/api/paas/v4/chat/completions"
    ]


# --- Chat Completions -> Anthropic Messages ---------------------------------------------------


def test_chat_create_against_an_anthropic_provider_r_xlate_1(
    stack: Stack, oai: openai.OpenAI
) -> None:
    """R-XLATE-1, R-XLATE-3: system prompt and mixed text+image content go out as a Messages
    request with anthropic-version; the message, finish reason and usage come back."""
    reply = oai.chat.completions.create(
        model="gpt-over-claude",
        messages=[
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe"},
                    {"type": "image_url", "image_url": {"url": PNG_URL}},
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}},
                ],
            },
        ],
    )
    server = stack.upstream("claude").server
    assert reply.choices[0].message.content == server.reply_text
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (17, 9)
    (request,) = claude_requests(stack)
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert request.headers["x-api-key"] == PROVIDER_KEY
    body = request.json
    assert body["system"] == "Be brief." and body["model"] == "claude-served"
    assert body["max_tokens"] == 4096  # the documented default: Chat does not require one
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "Describe"},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
        },
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}},
    ]


def test_chat_stream_against_an_anthropic_provider_r_xlate_1(
    stack: Stack, oai: openai.OpenAI
) -> None:
    """R-XLATE-1: Anthropic events become chunks; usage comes in the final usage chunk."""
    stream = oai.chat.completions.create(
        model="gpt-over-claude",
        messages=[{"role": "user", "content": "hello"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == stack.upstream("claude").server.reply_text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 9


def test_chat_tools_and_parallel_calls_against_an_anthropic_provider_r_xlate_1(
    stack: Stack, oai: openai.OpenAI
) -> None:
    """R-XLATE-1: parallel tool_use blocks become tool_calls, whole and streamed (argument
    deltas in order), and tool results go back as one user turn of tool_result blocks."""
    server = stack.upstream("claude").server
    server.parallel_tools = 2
    try:
        run_parallel_tool_calls(stack, oai)
    finally:
        server.parallel_tools = 1


def run_parallel_tool_calls(stack: Stack, oai: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris and Rome?"}]
    first = oai.chat.completions.create(model="gpt-over-claude", messages=messages, tools=[WEATHER])
    calls = first.choices[0].message.tool_calls or []
    assert first.choices[0].finish_reason == "tool_calls" and len(calls) == 2
    assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Paris"}] * 2  # type: ignore[union-attr]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages += [
        {"role": "tool", "tool_call_id": c.id, "content": f"sunny {i}"} for i, c in enumerate(calls)
    ]
    final = oai.chat.completions.create(model="gpt-over-claude", messages=messages, tools=[WEATHER])
    assert final.choices[0].message.content == stack.upstream("claude").server.reply_text
    sent = claude_requests(stack)[1].json
    assert sent["tools"][0]["input_schema"] == WEATHER["function"]["parameters"]  # type: ignore[index]
    assert [b["type"] for b in sent["messages"][1]["content"]] == ["tool_use", "tool_use"]
    assert sent["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": calls[0].id, "content": "sunny 0"},
        {"type": "tool_result", "tool_use_id": calls[1].id, "content": "sunny 1"},
    ]
    stream = oai.chat.completions.create(
        model="gpt-over-claude", messages=messages[:1], tools=[WEATHER], stream=True
    )
    arguments: dict[int, str] = {}
    for chunk in stream:
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            arguments[tc.index] = arguments.get(tc.index, "") + (tc.function.arguments or "")  # type: ignore[union-attr]
    assert {i: json.loads(a) for i, a in arguments.items()} == {
        0: {"city": "Paris"},
        1: {"city": "Paris"},
    }


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"logprobs": True}, "logprobs"), ({"temperature": 1.5}, "temperature"), ({"n": 2}, "n")],
)
def test_chat_options_without_a_messages_counterpart_are_refused_r_xlate_2(
    stack: Stack, oai: openai.OpenAI, extra: dict[str, Any], param: str
) -> None:
    """R-XLATE-2: 400 unsupported_operation naming the field, in the OpenAI shape."""
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(
            model="gpt-over-claude", messages=[{"role": "user", "content": "x"}], **extra
        )
    error = caught.value.body
    assert error["code"] == "unsupported_operation" and error["param"] == param  # type: ignore[index]
    assert claude_requests(stack) == []


def test_invalid_tool_arguments_from_the_client_are_refused(
    stack: Stack, oai: openai.OpenAI
) -> None:
    """A tool call in the history whose arguments are not JSON cannot become tool_use.input."""
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": "{oops"},
    }
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(
            model="gpt-over-claude",
            messages=[
                {"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "r"},
            ],
        )
    assert caught.value.body["param"] == "messages[1].tool_calls[0].function.arguments"  # type: ignore[index]


@pytest.mark.parametrize("fault", ["end_early", "stream_error"])
def test_a_broken_anthropic_stream_ends_in_an_openai_error(
    stack: Stack, oai: openai.OpenAI, fault: str
) -> None:
    """An Anthropic stream without message_stop, or with an ``error`` event, ends the
    client's chunk stream with an OpenAI error the SDK raises."""
    setattr(stack.upstream("claude").server.faults, fault, True)
    with pytest.raises(openai.APIError) as caught:
        list(
            oai.chat.completions.create(
                model="gpt-over-claude", messages=[{"role": "user", "content": "x"}], stream=True
            )
        )
    expected = "before its stop" if fault == "end_early" else "Overloaded"
    assert expected in str(caught.value)


def test_an_anthropic_refusal_comes_back_in_the_openai_shape(
    stack: Stack, oai: openai.OpenAI
) -> None:
    """An upstream 4xx/5xx is the client's own error shape."""
    stack.upstream("claude").server.faults.status = 529
    with pytest.raises(openai.APIStatusError) as caught:
        oai.chat.completions.create(
            model="gpt-over-claude", messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.status_code == 502
    assert caught.value.body["code"] == "upstream_error"  # type: ignore[index]


# --- Responses -> Chat Completions ------------------------------------------------------------


def test_responses_create_against_a_chat_provider_r_xlate_1(
    stack: Stack, oai: openai.OpenAI
) -> None:
    """R-XLATE-1: instructions, input items and an image go out as Chat; the Response comes
    back with its output text and usage."""
    reply = oai.responses.create(
        model="responses-over-glm",
        instructions="Be brief.",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Describe"},
                    {"type": "input_image", "image_url": PNG_URL, "detail": "auto"},
                ],
            }
        ],
        max_output_tokens=32,
    )
    assert reply.status == "completed"
    assert reply.output_text == stack.upstream("main").server.reply_text
    assert reply.usage is not None and (reply.usage.input_tokens, reply.usage.output_tokens) == (
        11,
        7,
    )
    (body,) = glm_requests(stack)
    assert body["model"] == "glm-4.6" and body["max_tokens"] == 32
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert body["messages"][1]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": PNG_URL, "detail": "auto"},
    }


def test_responses_stream_events_as_the_sdk_expects_r_xlate_1(
    stack: Stack, oai: openai.OpenAI
) -> None:
    """R-XLATE-1: response.created ... output_text deltas ... response.completed, accumulated
    by the SDK's own stream helper into the final Response."""
    with oai.responses.stream(model="responses-over-glm", input="hello") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds
    assert final.output_text == stack.upstream("main").server.reply_text
    assert final.usage is not None and final.usage.output_tokens == 7


def test_a_responses_function_call_round_trip_r_xlate_1(stack: Stack, oai: openai.OpenAI) -> None:
    """R-XLATE-1: a function call streamed as argument deltas, then its output sent back as a
    function_call_output item, answered in text."""
    with oai.responses.stream(
        model="responses-over-glm",
        input="Weather in Paris?",
        tools=[RESPONSES_WEATHER],  # type: ignore[list-item]
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert "".join(deltas) == call.arguments
    answer = oai.responses.create(
        model="responses-over-glm",
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
        tools=[RESPONSES_WEATHER],  # type: ignore[list-item]
    )
    assert answer.output_text == stack.upstream("main").server.reply_text
    sent = glm_requests(stack)[1]["messages"]
    assert sent[1]["tool_calls"][0]["id"] == call.call_id
    assert sent[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}


def test_without_translate_glm_serves_no_responses_r_prof_7(
    stack: Stack, oai: openai.OpenAI
) -> None:
    """R-PROF-7, R-XLATE-1: translate false keeps the original rule: GLM serves no Responses."""
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.create(model="glm-plain", input="hello")
    assert caught.value.body["code"] == "unsupported_operation"  # type: ignore[index]
    assert glm_requests(stack) == []


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"tools": [{"type": "web_search"}], "tool_choice": "required"}, "tool_choice"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ],
)
def test_responses_options_without_a_chat_counterpart_are_refused_r_xlate_2(
    stack: Stack, oai: openai.OpenAI, extra: dict[str, Any], param: str
) -> None:
    """R-XLATE-2: 400 unsupported_operation naming the field (what is only advice is
    dropped and named: tests/test_client_fixtures_e2e.py)."""
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.create(model="responses-over-glm", input="x", **extra)
    assert caught.value.body["param"] == param  # type: ignore[index]
    assert glm_requests(stack) == []


@pytest.mark.parametrize("fault", ["stream_error", "drop_mid_stream"])
def test_a_chat_stream_failing_mid_way_ends_the_responses_stream_with_response_failed_r_xlate_1(
    stack: Stack, oai: openai.OpenAI, fault: str
) -> None:
    """R-XLATE-1: a Chat stream that fails after its first chunk (an in-band error event, or
    the connection dropped) ends the translated Responses stream, already started, as the
    Responses API does: the SDK yields ``response.failed`` with status ``failed`` and the
    error's stable code and message; it raises nothing."""
    faults = stack.upstream("main").server.faults
    setattr(faults, fault, True)
    faults.delay = 0.2  # each chunk its own frame: the client's stream starts before the fault
    events = list(oai.responses.create(model="responses-over-glm", input="x", stream=True))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.failed" and kinds.count("response.failed") == 1
    assert "response.completed" not in kinds
    numbers = [event.sequence_number for event in events]
    assert numbers == list(range(numbers[0], numbers[0] + len(events)))
    failed = events[-1].response  # type: ignore[union-attr]
    assert failed.status == "failed" and failed.id == events[0].response.id  # type: ignore[union-attr]
    assert failed.error is not None and failed.error.code in ERRORS
    assert failed.error.message
    if fault == "stream_error":  # the text so far came first
        assert "response.output_text.delta" in kinds and "model crashed" in failed.error.message


def test_a_translated_responses_request_is_metered_under_responses(
    stack: Stack, oai: openai.OpenAI
) -> None:
    """R-XLATE-1: metered once, under the client's operation, with the provider's usage."""
    before = metric(
        stack, "iop_requests_total", operation="responses", model_group="responses-over-glm"
    )
    oai.responses.create(model="responses-over-glm", input="x")
    stack.wait_idle()
    after = metric(
        stack, "iop_requests_total", operation="responses", model_group="responses-over-glm"
    )
    assert after == before + 1
    assert (
        metric(
            stack,
            "iop_requests_total",
            operation="chat_completions",
            model_group="responses-over-glm",
        )
        == 0
    )
