"""The official ``anthropic`` SDK through a real Edge and Node against Chat Completions
providers (OpenAI-compatible and Ollama) by translation (R-XLATE-1), and the refusals and
failures of a translated request (R-XLATE-2), each ending with no lease held (R-POOL-9)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.support import Stack
from tests.support.translation import metric, translation_stack

pytestmark = pytest.mark.slow

WEATHER = {
    "name": "get_weather",
    "description": "Weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n fake image bytes").decode()
# model group -> (upstream name, upstream path, the fake's tokens in/out)
GROUPS = {
    "claude-over-chat": ("main", "/v1/chat/completions", (11, 7)),
    "claude-over-ollama": ("ollama", "/api/chat", (13, 5)),
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with translation_stack(tmp_path_factory.mktemp("xlate-ant")) as running:
        yield running


@pytest.fixture(autouse=True)
def idle_after(stack: Stack) -> Iterator[None]:
    stack.reset_upstreams()
    yield
    stack.wait_idle()  # R-POOL-9: no lease held, however the request ended


@pytest.fixture(params=sorted(GROUPS))
def group(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def sent(stack: Stack, group: str) -> list[Any]:
    name, path, _ = GROUPS[group]
    return [r.json for r in stack.upstream(name).server.requests if r.path == path]


def reply_text(stack: Stack, group: str) -> str:
    return str(stack.upstream(GROUPS[group][0]).server.reply_text)


def test_create_returns_the_providers_answer_as_a_message_r_xlate_1(
    stack: Stack, ant: anthropic.Anthropic, group: str
) -> None:
    """R-XLATE-1: system prompt, multi-part content with an image, the text answer, the stop
    reason and the provider's real usage."""
    reply = ant.messages.create(
        model=group,
        max_tokens=64,
        system="Be brief.",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in this picture?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                    },
                ],
            }
        ],
    )
    assert reply.type == "message" and reply.role == "assistant"
    assert reply.content[0].type == "text" and reply.content[0].text == reply_text(stack, group)
    assert reply.stop_reason == "end_turn"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == GROUPS[group][2]
    (body,) = sent(stack, group)
    assert body["messages"][0]["role"] == "system"
    assert body["messages"][0]["content"] == "Be brief."
    if group == "claude-over-chat":
        parts = body["messages"][1]["content"]
        assert parts[1] == {
            "type": "image_url",
            "image_url": {"url": f"data:image/png;base64,{PNG}"},
        }
    else:  # the Ollama adapter carries the image as base64
        assert body["messages"][1]["images"] == [PNG]


def test_stream_yields_the_text_and_message_delta_usage_r_xlate_1(
    stack: Stack, ant: anthropic.Anthropic, group: str
) -> None:
    """R-XLATE-1: the stream's events, as the SDK accumulates them, give the provider's text,
    stop reason and usage."""
    with ant.messages.stream(
        model=group, max_tokens=64, messages=[{"role": "user", "content": "hello"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == reply_text(stack, group)
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == GROUPS[group][2][1]


def test_a_tool_round_trip_r_xlate_1(stack: Stack, ant: anthropic.Anthropic, group: str) -> None:
    """R-XLATE-1: tools go out as functions, the call comes back as tool_use, the tool_result
    goes out as a tool message, and the model's text answer comes back."""
    question = {"role": "user", "content": "Weather in Paris?"}
    first = ant.messages.create(model=group, max_tokens=64, messages=[question], tools=[WEATHER])
    assert first.stop_reason == "tool_use"
    (call,) = [b for b in first.content if b.type == "tool_use"]
    expected = {"city": "Seoul"} if group == "claude-over-ollama" else {"city": "Paris"}
    assert call.name == "get_weather" and call.input == expected
    answer = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}],
    }
    history: list[Any] = [question, {"role": "assistant", "content": first.content}, answer]
    final = ant.messages.create(model=group, max_tokens=64, messages=history, tools=[WEATHER])
    assert final.content[0].type == "text" and final.content[0].text == reply_text(stack, group)
    second = sent(stack, group)[1]
    assert second["tools"][0]["function"]["name"] == "get_weather"
    if group == "claude-over-chat":
        assert second["messages"][-1] == {
            "role": "tool",
            "tool_call_id": call.id,
            "content": "sunny",
        }
        assert json.loads(second["messages"][-2]["tool_calls"][0]["function"]["arguments"]) == {
            "city": "Paris"
        }
    else:
        assert second["messages"][-1]["role"] == "tool"
        assert second["messages"][-1]["content"] == "sunny"


def test_streamed_tool_input_arrives_as_input_json_deltas_r_xlate_1(
    stack: Stack, ant: anthropic.Anthropic, group: str
) -> None:
    """R-XLATE-1: streamed argument fragments become input_json_delta events the SDK joins."""
    with ant.messages.stream(
        model=group,
        max_tokens=64,
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[WEATHER],
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert "content_block_start" in kinds and kinds[-1] == "message_stop"
    (call,) = [b for b in final.content if b.type == "tool_use"]
    assert call.name == "get_weather" and isinstance(call.input, dict) and call.input["city"]
    assert final.stop_reason == "tool_use"


def test_count_tokens_is_an_estimate_where_the_provider_has_none_r_xlate_1(
    stack: Stack, ant: anthropic.Anthropic, group: str
) -> None:
    """R-XLATE-1: count_tokens answers by the documented estimate; nothing runs upstream."""
    small = ant.messages.count_tokens(model=group, messages=[{"role": "user", "content": "hi"}])
    large = ant.messages.count_tokens(
        model=group, messages=[{"role": "user", "content": "hi " * 400}]
    )
    assert 0 < small.input_tokens < large.input_tokens
    assert sent(stack, group) == []


def test_a_translated_request_is_metered_once_with_the_providers_usage(
    stack: Stack, ant: anthropic.Anthropic
) -> None:
    """R-XLATE-1: one record under the client's operation, with the provider's real tokens."""
    labels = {"operation": "messages", "model_group": "claude-over-chat"}
    before = metric(stack, "iop_requests_total", **labels)
    tokens_before = metric(
        stack, "iop_tokens_total", model_group="claude-over-chat", estimated="false"
    )
    ant.messages.create(
        model="claude-over-chat", max_tokens=8, messages=[{"role": "user", "content": "x"}]
    )
    stack.wait_idle()
    assert metric(stack, "iop_requests_total", **labels) == before + 1
    assert metric(stack, "iop_requests_total", operation="chat_completions") == 0
    tokens = metric(stack, "iop_tokens_total", model_group="claude-over-chat", estimated="false")
    assert tokens == tokens_before + 11 + 7


def test_without_translate_a_chat_provider_serves_no_messages_r_xlate_1(
    stack: Stack, ant: anthropic.Anthropic
) -> None:
    """R-XLATE-1, R-PROF-4: translate false keeps the original admission rule exactly."""
    with pytest.raises(anthropic.BadRequestError) as caught:
        ant.messages.create(
            model="chat-plain", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert stack.upstream().server.requests == []


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"container": "container-1"}, "container"),
        ({"thinking": {"type": "sometimes"}}, "thinking.type"),
        (
            {
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
                "tool_choice": {"type": "tool", "name": "web_search"},
            },
            "tool_choice.name",
        ),
    ],
)
def test_what_has_no_counterpart_is_refused_naming_the_field_r_xlate_2(
    stack: Stack, http: Any, extra: dict[str, Any], param: str
) -> None:
    """R-XLATE-2: 400 unsupported_operation naming the field, never silently dropped (what
    is only advice is dropped and named: test_client_fixtures_e2e.py)."""
    body = {
        "model": "claude-over-chat",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "x"}],
        **extra,
    }
    reply = http.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert reply.status_code == 400
    error = reply.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert f"'{param}'" in error["error"]["message"]
    assert stack.upstream().server.requests == []


@pytest.mark.parametrize(
    ("content", "where"),
    [
        (
            [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/bmp", "data": PNG},
                }
            ],
            "messages[0].content[0].source.media_type",
        ),
        (
            [{"type": "text", "text": "a"}, {"type": "hologram", "data": "?"}],
            "messages[0].content[1].type",
        ),
        (
            [{"type": "document", "source": {"type": "text", "data": "x"}}],
            "messages[0].content[0].type",
        ),
    ],
    ids=["image-format", "unknown-block", "document-block"],
)
def test_bad_content_is_a_clear_anthropic_error(
    stack: Stack, ant: anthropic.Anthropic, content: list[Any], where: str
) -> None:
    """R-XLATE-2: an unsupported image type or an unknown content block is refused in the
    Anthropic error shape, naming where it is."""
    with pytest.raises(anthropic.BadRequestError) as caught:
        ant.messages.create(
            model="claude-over-chat", max_tokens=8, messages=[{"role": "user", "content": content}]
        )
    assert where in str(caught.value)
    assert stack.upstream().server.requests == []


def test_invalid_json_tool_arguments_from_the_provider_are_a_clear_error(
    stack: Stack, ant: anthropic.Anthropic
) -> None:
    """A provider tool call whose arguments are not JSON cannot become tool_use.input: 502 in
    the Anthropic shape, whole or streamed."""
    server = stack.upstream().server
    server.tool_arguments = '{"city": Par'
    try:
        expect_invalid_arguments_error(ant)
    finally:
        server.tool_arguments = '{"city":"Paris"}'


def expect_invalid_arguments_error(ant: anthropic.Anthropic) -> None:
    question = [{"role": "user", "content": "Weather?"}]
    with pytest.raises(anthropic.APIStatusError) as caught:
        ant.messages.create(
            model="claude-over-chat", max_tokens=8, messages=question, tools=[WEATHER]
        )
    assert caught.value.status_code == 502 and "not valid JSON" in str(caught.value)
    # Streamed: a 502 when the bad call arrives before any output, else the stream ends with
    # an Anthropic ``error`` event. Read on the wire: once the stream has started, the SDK's
    # own partial-JSON parsing of the argument deltas may raise before it reaches that event.
    body = {
        "model": "claude-over-chat",
        "max_tokens": 8,
        "messages": question,
        "tools": [WEATHER],
        "stream": True,
    }
    headers = {"x-api-key": ant.api_key, "anthropic-version": "2023-06-01"}
    with httpx.Client(base_url=str(ant.base_url), timeout=30) as client:
        answer = client.post("/v1/messages", json=body, headers=headers)
    if answer.status_code != 200:
        assert answer.status_code == 502
        assert answer.json()["error"]["message"].find("not valid JSON") >= 0
        return
    events = [line for line in answer.text.split("\n") if line.startswith("data:")]
    last = json.loads(events[-1][5:])
    assert last["type"] == "error" and "not valid JSON" in last["error"]["message"]
    assert "message_stop" not in answer.text


@pytest.mark.parametrize("fault", ["end_early", "stream_error"])
def test_a_broken_upstream_stream_ends_in_an_anthropic_error_event(
    stack: Stack, ant: anthropic.Anthropic, fault: str
) -> None:
    """An upstream stream that ends without its stop event, or reports an error mid-stream,
    ends the client's stream with an Anthropic ``error`` event, never a silent truncation."""
    setattr(stack.upstream().server.faults, fault, True)
    with (
        pytest.raises(anthropic.APIStatusError) as caught,
        ant.messages.stream(
            model="claude-over-chat", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        ) as stream,
    ):
        stream.until_done()
    expected = "before its stop event" if fault == "end_early" else "model crashed"
    assert expected in str(caught.value)


def test_a_cli_provider_serves_the_anthropic_sdk_by_translation_r_xlate_1(
    stack: Stack, ant: anthropic.Anthropic
) -> None:
    """R-XLATE-1: a CLI program (normalized Chat output) answers an Anthropic client, whole
    and streamed; an image, which a CLI program cannot take, is refused (R-XLATE-2)."""
    reply = ant.messages.create(
        model="claude-over-cli", max_tokens=32, messages=[{"role": "user", "content": "ping cli"}]
    )
    assert reply.content[0].type == "text" and reply.content[0].text == "ping cli"
    assert reply.stop_reason == "end_turn"
    with ant.messages.stream(
        model="claude-over-cli", max_tokens=32, messages=[{"role": "user", "content": "two parts"}]
    ) as stream:
        assert "".join(stream.text_stream) == "two parts"
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        ant.messages.create(
            model="claude-over-cli", max_tokens=8, messages=[{"role": "user", "content": [image]}]
        )
    assert "text only" in str(caught.value)


def test_a_client_leaving_a_translated_stream_releases_the_lease_r_pool_9(
    stack: Stack, ant: anthropic.Anthropic
) -> None:
    """R-POOL-9: a client that leaves a translated stream mid-way ends the run upstream and
    the lease is released, as for an untranslated one."""
    upstream = stack.upstream()
    upstream.server.faults.delay = 0.5  # between chunks: the client leaves mid-stream
    with ant.messages.stream(
        model="claude-over-chat", max_tokens=64, messages=[{"role": "user", "content": "x"}]
    ) as stream:
        first = next(iter(stream))
        assert first.type == "message_start"
    assert upstream.wait_disconnect(10)
    stack.wait_idle()
