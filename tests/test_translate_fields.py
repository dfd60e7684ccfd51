"""The translation tables (R-XLATE-4, R-XLATE-5): every row of every table exercised on the
translator it documents (mapped to what it says, dropped and named, or refused naming it);
docs/http-api.md shows exactly these rows; reasoning goes to each provider's own switch and
comes back as thinking blocks or reasoning items when asked; what is dropped is bounded."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pool.translate import messages_via_chat as mvc
from pool.translate import responses_via_chat as rvc
from pool.translate.common import TranslationError
from pool.translate.fields import (
    ANSWER_FROM_CHAT,
    MAX_DROPPED,
    MESSAGES_TO_CHAT,
    RESPONSES_TO_CHAT,
    TABLES,
    Dropped,
    Options,
    metric_label,
    render,
)
from pool.translate.messages_via_chat_stream import MessagesViaChatStream
from pool.translate.responses_via_chat_stream import ResponsesViaChatStream
from pool.translate.select import translation

DOCS = Path(__file__).resolve().parent.parent / "docs" / "http-api.md"
WEATHER = {"name": "get_weather", "input_schema": {"type": "object"}}
FUNCTION = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
Check = Callable[[dict[str, Any]], bool]

# --- Anthropic Messages -> Chat ----------------------------------------------------------------

MESSAGES: dict[str, tuple[dict[str, Any], Check | None]] = {
    "model": ({}, lambda c: c["model"] == "served"),
    "messages": ({}, lambda c: c["messages"][-1] == {"role": "user", "content": "x"}),
    "system": ({"system": "be brief"}, lambda c: c["messages"][0]["content"] == "be brief"),
    "max_tokens": ({}, lambda c: c["max_tokens"] == 8),
    "temperature": ({"temperature": 0.5}, lambda c: c["temperature"] == 0.5),
    "top_p": ({"top_p": 0.9}, lambda c: c["top_p"] == 0.9),
    "stream": ({"stream": True}, lambda c: c["stream_options"] == {"include_usage": True}),
    "stop_sequences": ({"stop_sequences": ["END"]}, lambda c: c["stop"] == ["END"]),
    "tools": ({"tools": [WEATHER]}, lambda c: c["tools"][0]["function"]["name"] == "get_weather"),
    "tool_choice": (
        {"tools": [WEATHER], "tool_choice": {"type": "any"}},
        lambda c: c["tool_choice"] == "required",
    ),
    "metadata": ({"metadata": {"user_id": "u-1"}}, lambda c: c["user"] == "u-1"),
    "thinking": (
        {"thinking": {"type": "enabled", "budget_tokens": 2000}},
        lambda c: c["reasoning_effort"] == "low",
    ),
    "output_config": (
        {"output_config": {"effort": "max"}},
        lambda c: c["reasoning_effort"] == "high",
    ),
    "context_management": ({"context_management": {"edits": []}}, None),
    "cache_control": (
        {"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}]},
        None,
    ),
    "tools[].defer_loading": ({"tools": [{**WEATHER, "defer_loading": True}]}, None),
    "tools[] server tools": ({"tools": [{"type": "web_search_20250305", "name": "web"}]}, None),
    "top_k": ({"top_k": 5}, None),
    "service_tier": ({"service_tier": "auto"}, None),
    "messages[] thinking blocks": (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}]},
                {"role": "user", "content": "y"},
            ]
        },
        None,
    ),
    "container": ({"container": "c"}, None),
    "mcp_servers": ({"mcp_servers": []}, None),
}

RESPONSES: dict[str, tuple[dict[str, Any], Check | None]] = {
    "model": ({}, lambda c: c["model"] == "served"),
    "input": ({}, lambda c: c["messages"] == [{"role": "user", "content": "hi"}]),
    "instructions": ({"instructions": "terse"}, lambda c: c["messages"][0]["role"] == "system"),
    "max_output_tokens": ({"max_output_tokens": 9}, lambda c: c["max_tokens"] == 9),
    "temperature": ({"temperature": 0.2}, lambda c: c["temperature"] == 0.2),
    "top_p": ({"top_p": 0.5}, lambda c: c["top_p"] == 0.5),
    "parallel_tool_calls": (
        {"tools": [FUNCTION], "parallel_tool_calls": False},
        lambda c: c["parallel_tool_calls"] is False,
    ),
    "stream": ({"stream": True}, lambda c: c["stream"] is True),
    "tools": (
        {
            "tools": [
                FUNCTION,
                {"type": "namespace", "name": "crm", "description": "d", "tools": [FUNCTION]},
            ]
        },
        lambda c: (
            [t["function"]["name"] for t in c["tools"]] == ["get_weather", "crm__get_weather"]
        ),
    ),
    "tool_choice": (
        {"tools": [FUNCTION], "tool_choice": "none"},
        lambda c: c["tool_choice"] == "none",
    ),
    "text": (
        {"text": {"format": {"type": "json_schema", "name": "o", "schema": {"type": "object"}}}},
        lambda c: c["response_format"]["type"] == "json_schema",
    ),
    "reasoning": ({"reasoning": {"effort": "high"}}, lambda c: c["reasoning_effort"] == "high"),
    "prompt_cache_key": ({"prompt_cache_key": "k"}, lambda c: c["prompt_cache_key"] == "k"),
    "safety_identifier": ({"safety_identifier": "s"}, lambda c: c["safety_identifier"] == "s"),
    "user": ({"user": "u"}, lambda c: c["user"] == "u"),
    "store": ({"store": False}, lambda c: "store" not in c),
    "include": ({"include": ["reasoning.encrypted_content"]}, None),
    "metadata": ({"metadata": {"a": "b"}}, None),
    "client_metadata": ({"client_metadata": {"a": "b"}}, None),
    "tools[] built-in tools": ({"tools": [{"type": "web_search"}]}, None),
    "text.verbosity": ({"text": {"verbosity": "low"}}, None),
    "truncation": ({"truncation": "auto"}, None),
    "service_tier": ({"service_tier": "flex"}, None),
    "max_tool_calls": ({"max_tool_calls": 3}, None),
    "top_logprobs": ({"top_logprobs": 2}, None),
    "stream_options": ({"stream_options": {"include_obfuscation": False}}, None),
    "input[] reasoning items": (
        {"input": [{"type": "reasoning", "summary": []}, {"role": "user", "content": "hi"}]},
        None,
    ),
    "previous_response_id": ({"previous_response_id": "resp_1"}, None),
    "conversation": ({"conversation": "conv_1"}, None),
    "background": ({"background": True}, None),
    "prompt": ({"prompt": {"id": "p"}}, None),
}

DIRECTIONS = {
    "messages": (MESSAGES_TO_CHAT, MESSAGES, mvc.chat_request),
    "responses": (RESPONSES_TO_CHAT, RESPONSES, rvc.chat_request),
}
BASES = {
    "messages": {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]},
    "responses": {"model": "m", "input": "hi"},
}
ROWS = [(d, name) for d, (table, _, _) in DIRECTIONS.items() for name in table]


def test_every_row_has_an_example() -> None:
    for direction, (table, examples, _) in DIRECTIONS.items():
        assert set(table) == set(examples), direction


@pytest.mark.parametrize(("direction", "name"), ROWS)
def test_each_row_does_what_the_table_says(direction: str, name: str) -> None:
    table, examples, translate = DIRECTIONS[direction]
    row = table[name]
    change, check = examples[name]
    request = {**BASES[direction], **change}
    options = Options()
    if row.action == "refuse":
        with pytest.raises(TranslationError) as refused:
            translate(request, "served", options)
        assert refused.value.param == name, refused.value.message
        return
    chat, _ = translate(request, "served", options)
    if row.action == "drop":
        assert name in options.dropped.names
        return
    assert check is not None and check(chat), chat
    assert name not in options.dropped.names


@pytest.mark.parametrize(("direction", "name"), [r for r in ROWS if r[1] != "model"])
def test_a_group_that_refuses_drops_refuses_each_dropped_row(direction: str, name: str) -> None:
    """R-XLATE-5: ``translate: {unsupported: refuse}``: what would be dropped is a 400."""
    table, examples, translate = DIRECTIONS[direction]
    if table[name].action != "drop":
        return
    request = {**BASES[direction], **examples[name][0]}
    with pytest.raises(TranslationError) as refused:
        translate(request, "served", Options(dropped=Dropped(refuse=True)))
    assert refused.value.param == name
    assert "translate.unsupported: refuse" in refused.value.message


def test_docs_show_exactly_the_rows() -> None:
    text = DOCS.read_text()
    for title, table in TABLES.items():
        assert f"### {title}\n\n{render(table)}\n" in text, f"docs/http-api.md: {title}"


# --- reasoning: each provider's switch ---------------------------------------------------------


@pytest.mark.parametrize(
    ("style", "expected", "dropped"),
    [
        ("reasoning_effort", {"reasoning_effort": "medium"}, []),
        ("glm", {"thinking": {"type": "enabled"}}, ["output_config.effort"]),
        (
            "enable_thinking",
            {"chat_template_kwargs": {"enable_thinking": True}},
            ["output_config.effort"],
        ),
        ("none", {}, ["thinking"]),
    ],
)
def test_claude_code_s_thinking_reaches_each_provider_s_own_switch(
    style: str, expected: dict[str, Any], dropped: list[str]
) -> None:
    request = {
        **BASES["messages"],
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "medium"},
    }
    options = Options(thinking=style)
    chat, _ = mvc.chat_request(request, "served", options)
    switch = {
        k: chat[k] for k in ("reasoning_effort", "thinking", "chat_template_kwargs") if k in chat
    }
    assert switch == expected
    assert options.dropped.names == dropped


@pytest.mark.parametrize(
    ("style", "expected"),
    [
        ("reasoning_effort", {}),
        ("glm", {"thinking": {"type": "disabled"}}),
        ("enable_thinking", {"chat_template_kwargs": {"enable_thinking": False}}),
    ],
)
def test_reasoning_turned_off_turns_off_a_provider_switch(
    style: str, expected: dict[str, Any]
) -> None:
    options = Options(thinking=style)
    chat, _ = rvc.chat_request(
        {**BASES["responses"], "reasoning": {"effort": "none"}}, "s", options
    )
    switch = {
        k: chat[k] for k in ("reasoning_effort", "thinking", "chat_template_kwargs") if k in chat
    }
    assert switch == expected


def test_the_glm_profiles_declare_their_own_switch_and_a_vllm_profile_can() -> None:
    from catalog.config.profiles.builtin import BUILTIN_PROFILES

    assert BUILTIN_PROFILES["glm"].thinking() == "glm"
    assert BUILTIN_PROFILES["glm_coding"].thinking() == "glm"
    assert BUILTIN_PROFILES["openai"].thinking() == "reasoning_effort"
    assert BUILTIN_PROFILES["ollama"].thinking() == "none"


# --- what changes the answer's meaning is always refused ---------------------------------------


def test_a_tool_choice_naming_a_left_out_tool_is_refused() -> None:
    server = {"type": "web_search_20250305", "name": "web"}
    with pytest.raises(TranslationError) as refused:
        mvc.chat_request(
            {
                **BASES["messages"],
                "tools": [server],
                "tool_choice": {"type": "tool", "name": "web"},
            },
            "s",
        )
    assert refused.value.param == "tool_choice.name"
    with pytest.raises(TranslationError) as again:
        rvc.chat_request(
            {
                **BASES["responses"],
                "tools": [{"type": "web_search"}],
                "tool_choice": {"type": "web_search"},
            },
            "s",
        )
    assert again.value.param == "tool_choice"


def test_structured_output_to_a_provider_without_it_is_refused_even_when_drops_are_allowed() -> (
    None
):
    schema = {"type": "json_schema", "name": "o", "schema": {"type": "object"}}
    with pytest.raises(TranslationError) as refused:
        rvc.chat_request(
            {**BASES["responses"], "text": {"format": schema}}, "s", Options(structured=False)
        )
    assert refused.value.param == "text.format"
    fmt = {"format": {"type": "json_schema", "schema": {"type": "object"}}}
    with pytest.raises(TranslationError) as again:
        mvc.chat_request(
            {**BASES["messages"], "output_config": fmt}, "s", Options(structured=False)
        )
    assert again.value.param == "output_config.format"
    chat, _ = mvc.chat_request({**BASES["messages"], "output_config": fmt}, "s")
    assert chat["response_format"]["json_schema"]["schema"] == {"type": "object"}


def test_required_tool_choice_with_every_tool_left_out_is_refused() -> None:
    with pytest.raises(TranslationError) as refused:
        rvc.chat_request(
            {**BASES["responses"], "tools": [{"type": "web_search"}], "tool_choice": "required"},
            "s",
        )
    assert refused.value.param == "tool_choice"


# --- what is dropped: named, bounded, never a client's text in a label -------------------------


def test_an_unknown_field_is_dropped_by_name_and_counted_as_other() -> None:
    options = Options()
    mvc.chat_request({**BASES["messages"], "speed": "fast", "bad name\n": 1}, "s", options)
    assert options.dropped.names == ["speed", "(unnamed)"]
    assert [metric_label(n) for n in options.dropped.names] == ["other", "other"]
    assert metric_label("cache_control") == "cache_control"


def test_the_dropped_list_is_bounded() -> None:
    options = Options()
    many = {f"field{i}": 1 for i in range(100)}
    mvc.chat_request({**BASES["messages"], **many}, "s", options)
    assert len(options.dropped.names) == MAX_DROPPED


def test_an_empty_include_drops_nothing() -> None:
    """The OpenAI Agents SDK sends ``include: []`` on every request."""
    translated = translation(
        "responses_via_chat",
        {**BASES["responses"], "include": []},
        "s",
        stream=False,
        input_estimate=1,
    )
    assert translated.dropped == ()


# --- the answer back ---------------------------------------------------------------------------

CHAT_ANSWER = {
    "id": "chatcmpl-1",
    "model": "served",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "reasoning_content": "Let me think.",
                "content": "Calling.",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "crm__get_weather", "arguments": "{}"},
                    }
                ],
            },
        }
    ],
    "usage": {
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "prompt_tokens_details": {"cached_tokens": 60},
        "completion_tokens_details": {"reasoning_tokens": 5},
    },
}
ANSWERING = rvc.Answering(rvc.echo_fields({}), {"crm__get_weather": ("crm", "get_weather")}, True)


def _messages(thinking: bool = True) -> dict[str, Any]:
    return json.loads(mvc.messages_response(json.dumps(CHAT_ANSWER), thinking))


def _responses(answering: rvc.Answering = ANSWERING) -> dict[str, Any]:
    return json.loads(rvc.responses_response(json.dumps(CHAT_ANSWER), answering))


ANSWERS: dict[str, Callable[[], bool]] = {
    "content": lambda: (
        _messages()["content"][1] == {"type": "text", "text": "Calling."}
        and _responses()["output"][1]["content"][0]["text"] == "Calling."
    ),
    "tool_calls": lambda: (
        _messages()["content"][2]["name"] == "crm__get_weather"
        and (_responses()["output"][2]["namespace"], _responses()["output"][2]["name"])
        == ("crm", "get_weather")
    ),
    "reasoning_content": lambda: (
        _messages()["content"][0]["thinking"] == "Let me think."
        and _responses()["output"][0]["summary"][0]["text"] == "Let me think."
        and _messages(False)["content"][0]["type"] == "text"
        and _responses(rvc.Answering(rvc.echo_fields({})))["output"][0]["type"] == "message"
    ),
    "finish_reason": lambda: (
        _messages()["stop_reason"] == "tool_use" and _responses()["status"] == "completed"
    ),
    "usage": lambda: (
        _messages()["usage"]
        == {"input_tokens": 40, "cache_read_input_tokens": 60, "output_tokens": 20}
        and _responses()["usage"]["input_tokens_details"] == {"cached_tokens": 60}
        and _responses()["usage"]["output_tokens_details"] == {"reasoning_tokens": 5}
    ),
}


def test_every_answer_row_has_an_example() -> None:
    assert set(ANSWER_FROM_CHAT) == set(ANSWERS)


@pytest.mark.parametrize("name", sorted(ANSWER_FROM_CHAT))
def test_each_answer_row_comes_back_as_the_table_says(name: str) -> None:
    assert ANSWERS[name]()


def _chunks(*deltas: dict[str, Any]) -> str:
    out = []
    for delta in deltas:
        choice = {"index": 0, "delta": delta, "finish_reason": None}
        out.append(
            "data: " + json.dumps({"id": "chatcmpl-1", "model": "m", "choices": [choice]}) + "\n\n"
        )
    end = {
        "id": "chatcmpl-1",
        "model": "m",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
    }
    return "".join(out) + "data: " + json.dumps(end) + "\n\ndata: [DONE]\n\n"


REASONING_STREAM = _chunks(
    {"reasoning_content": "Hmm, "}, {"reasoning_content": "yes."}, {"content": "Hi"}
)


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_streamed_reasoning_becomes_a_thinking_block_when_asked_and_nothing_otherwise() -> None:
    shown = MessagesViaChatStream("m", thinking=True)
    events = _events(shown.feed(REASONING_STREAM) + shown.close())
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    thought = [
        e["delta"]["thinking"] for e in events if e.get("delta", {}).get("type") == "thinking_delta"
    ]
    assert "".join(thought) == "Hmm, yes."
    hidden = MessagesViaChatStream("m")
    events = _events(hidden.feed(REASONING_STREAM) + hidden.close())
    assert [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"] == [
        "text"
    ]


def test_streamed_reasoning_becomes_a_summary_item_when_asked() -> None:
    stream = ResponsesViaChatStream("m", ANSWERING)
    events = _events(stream.feed(REASONING_STREAM) + stream.close())
    kinds = [e["type"] for e in events]
    assert kinds[:8] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
    ]
    final = events[-1]["response"]
    assert final["output"][0] == {
        "id": final["output"][0]["id"],
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "Hmm, yes."}],
    }
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    plain = ResponsesViaChatStream("m", rvc.Answering(rvc.echo_fields({})))
    events = _events(plain.feed(REASONING_STREAM) + plain.close())
    assert [item["type"] for item in events[-1]["response"]["output"]] == ["message"]


def test_a_streamed_call_of_a_namespaced_function_comes_back_with_its_namespace() -> None:
    call = {
        "index": 0,
        "id": "c1",
        "type": "function",
        "function": {"name": "crm__get_weather", "arguments": "{}"},
    }
    stream = ResponsesViaChatStream("m", ANSWERING)
    events = _events(stream.feed(_chunks({"tool_calls": [call]})) + stream.close())
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert (done[0]["namespace"], done[0]["name"]) == ("crm", "get_weather")
