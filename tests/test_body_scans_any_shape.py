"""R-IN-7: no request body answers 500. Every scan of a body before the pool decides (the
checks of ``parse_request``, the binary-part walk of the token estimate) and every request
translator (R-XLATE-1) take JSON of any shape: a property may be named ``type``,
``properties``, ``items`` or ``enum`` and hold an object at any depth. Hypothesis puts
arbitrary JSON values in every field the three APIs define, at every level; the only
exceptions allowed are the documented refusals (``HttpError``, ``TranslationError``).

The same property runs against a real Edge in ``tests/test_fuzz_api_e2e.py``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pool.http.errors import HttpError
from pool.http.operations import ENDPOINTS, binary_parts, estimate_tokens, parse_request
from pool.translate.common import TranslationError
from pool.translate.select import translation
from tests.support.clients import recorded
from tests.support.examples import SLOW_PROPERTY_TIMEOUT_S, examples

pytestmark = pytest.mark.timeout(SLOW_PROPERTY_TIMEOUT_S)  # CPU-bound on a busy machine

# Names the APIs give meaning to, so generated objects hit the branches that read them.
KEYS = [
    "type", "text", "role", "content", "image_url", "url", "source", "media_type", "data",
    "properties", "items", "enum", "name", "input_schema", "parameters", "tools", "input",
    "tool_use_id", "id", "function", "arguments", "format", "schema", "effort", "summary",
    "budget_tokens", "user_id", "cache_control", "namespace", "call_id", "output", "detail",
    "image", "file", "document", "input_image", "thinking", "reasoning_content", "metadata",
]  # fmt: skip
TYPES = [
    "text", "image", "image_url", "input_image", "input_text", "output_text", "tool_use",
    "tool_result", "function", "namespace", "web_search", "custom", "message", "reasoning",
    "function_call", "function_call_output", "thinking", "redacted_thinking", "enabled",
    "adaptive", "disabled", "json_schema", "json_object", "base64", "object", "string",
    "document", "input_file", "file", "auto", "any", "tool", "none", "required",
]  # fmt: skip
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**65), max_value=2**65)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(TYPES)
    | st.sampled_from(["image data", "data:image/png;base64," + "A" * 70, "user", "system"])
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=5)
    ),
    max_leaves=30,
)
TOP = [
    "model", "messages", "input", "instructions", "system", "tools", "tool_choice", "stream",
    "stream_options", "max_tokens", "max_output_tokens", "metadata", "thinking", "reasoning",
    "include", "text", "response_format", "output_config", "temperature", "stop",
    "stop_sequences", "store", "user", "prompt_cache_key", "context_management", "n",
]  # fmt: skip
blocks = st.lists(
    st.dictionaries(st.sampled_from(KEYS), json_values, max_size=4).flatmap(
        lambda d: st.sampled_from(TYPES).map(lambda t: {"type": t, **d})
    )
    | json_values,
    max_size=3,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "developer", "tool"])},
        optional={"content": st.text(max_size=8) | blocks, "type": st.sampled_from(TYPES)},
    ).flatmap(
        lambda m: st.dictionaries(st.sampled_from(KEYS), json_values, max_size=2).map(
            lambda extra: {**extra, **m}
        )
    ),
    min_size=1,
    max_size=3,
)
bodies = st.fixed_dictionaries(
    {"model": st.just("m"), "messages": messages | json_values, "max_tokens": st.just(16)},
    optional={name: json_values for name in TOP if name not in ("model", "messages", "max_tokens")}
    | {"input": messages | json_values, "tools": st.lists(json_values, max_size=3)},
)
# translation -> the endpoint whose parsed requests take it (parse_request runs first)
KINDS = {
    "messages_via_chat": "/v1/messages",
    "chat_via_messages": "/v1/chat/completions",
    "responses_via_chat": "/v1/responses",
    "count_tokens_estimate": "/v1/messages/count_tokens",
}
DRIVERS = ["openai_chat", "ollama", "cli", "anthropic_messages"]
SETTINGS = settings(
    max_examples=examples(100),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@SETTINGS
@given(data=json_values)
def test_binary_part_walk_takes_any_json(data: Any) -> None:
    chars, parts = binary_parts(data)
    assert chars >= 0 and parts >= 0
    body = json.dumps(data).encode()
    assert estimate_tokens(body, data) >= 0


@SETTINGS
@given(body=bodies)
def test_every_endpoint_parses_any_field_shape_or_refuses_with_a_400(body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    for endpoint in ENDPOINTS.values():
        try:
            parse_request(endpoint, raw)
        except HttpError as refused:
            assert refused.code == "invalid_request", refused.code


@SETTINGS
@given(body=bodies, kind=st.sampled_from(sorted(KINDS)))
def test_every_translator_takes_any_field_shape_or_refuses_naming_it(
    body: dict[str, Any], kind: str
) -> None:
    try:
        parsed = parse_request(ENDPOINTS[KINDS[kind]], json.dumps(body).encode())
    except HttpError:
        return
    for driver in DRIVERS:
        data = json.loads(json.dumps(parsed.data))
        try:
            translation(kind, data, "served", stream=parsed.stream, input_estimate=1, driver=driver)
        except TranslationError as refused:
            assert refused.code in ("unsupported_operation", "invalid_request"), refused.code


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON document where a value sits (the document itself excluded)."""
    out: list[tuple[Any, ...]] = []
    children = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in children:
        out.append((*at, key))
        out += _paths(child, (*at, key))
    return out


def _replaced(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    copy = json.loads(json.dumps(document))
    holder = copy
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    return copy


# The recorded bodies of the real clients (tests/fixtures/clients): every field at every depth.
SEEDS = [("messages_via_chat", r.body) for r in recorded("claude-code")] + [
    ("responses_via_chat", r.body) for r in recorded("codex")
]
SEED_PATHS = [(kind, body, _paths(body)) for kind, body in SEEDS]


@settings(
    max_examples=examples(300),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def test_any_value_anywhere_in_a_real_client_s_request_is_served_or_refused_with_a_400(
    data: st.DataObject,
) -> None:
    """R-IN-7 on the requests Claude Code and Codex really send: one value at any path (a
    schema property, a tool's ``type``, a message's role, ...) replaced by any JSON value."""
    kind, body, paths = data.draw(st.sampled_from(SEED_PATHS))
    path = data.draw(st.sampled_from(paths))
    mutated = _replaced(body, path, data.draw(json_values))
    try:
        parsed = parse_request(ENDPOINTS[KINDS[kind]], json.dumps(mutated).encode())
    except HttpError as refused:
        assert refused.code == "invalid_request", refused.code
        return
    for driver in DRIVERS:
        try:
            translation(
                kind, parsed.data, "served", stream=parsed.stream, input_estimate=1, driver=driver
            )
        except TranslationError as refused:
            assert refused.code in ("unsupported_operation", "invalid_request"), refused.code


@pytest.mark.parametrize("name", ["type", "properties", "items", "enum", "image", "data"])
def test_a_schema_property_named_like_a_keyword_is_served_at_any_depth(name: str) -> None:
    """The issue's bad input: ``type``, ``properties``, ``items`` or ``enum`` as property
    names, holding objects, nested three deep, on every operation and translation."""
    inner: dict[str, Any] = {"type": "object", "properties": {name: {"type": "string"}}}
    for _ in range(3):
        inner = {"type": "object", "properties": {name: inner}, "items": {name: {name: "x"}}}
    tool_chat = {"type": "function", "function": {"name": "t", "parameters": inner}}
    bodies = {
        "/v1/chat/completions": {
            "model": "m",
            "messages": [{"role": "user", "content": "image"}],
            "tools": [tool_chat],
        },
        "/v1/responses": {
            "model": "m",
            "input": "image",
            "tools": [{"type": "function", "name": "t", "parameters": inner}],
        },
        "/v1/messages": {
            "model": "m",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "image"}],
            "tools": [{"name": "t", "input_schema": inner}],
        },
    }
    for path, body in bodies.items():
        parsed = parse_request(ENDPOINTS[path], json.dumps(body).encode())
        assert parsed.input_tokens_estimate > 0
    for kind, path in (
        ("messages_via_chat", "/v1/messages"),
        ("responses_via_chat", "/v1/responses"),
        ("chat_via_messages", "/v1/chat/completions"),
    ):
        translated = translation(
            kind, json.loads(json.dumps(bodies[path])), "s", stream=False, input_estimate=1
        )
        assert inner == json.loads(translated.body)["tools"][0].get(
            "input_schema",
            json.loads(translated.body)["tools"][0].get("function", {}).get("parameters"),
        )


def test_r_in_7_the_reproduction_a_type_property_beside_the_word_image_is_served() -> None:
    """The body of the issue: a tool whose JSON schema has a property named ``type`` holding
    an object, and the word "image" elsewhere, was a TypeError (500) in the binary-part walk."""
    tool = {
        "type": "function",
        "function": {
            "name": "view_image",
            "parameters": {
                "type": "object",
                "properties": {"type": {"type": "string", "enum": ["png", "jpeg"]}},
            },
        },
    }
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "describe the image"}],
        "tools": [tool],
        "metadata": {"type": {"nested": "image"}},
    }
    parsed = parse_request(ENDPOINTS["/v1/chat/completions"], json.dumps(body).encode())
    assert parsed.input_tokens_estimate > 0
