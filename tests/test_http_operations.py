"""Operation -> needs (R-PROF-4), token estimate -> context class (R-POOL-7), request checks,
and the upstream body: served model (R-PROF-5, R-CFG-2) and metered chat streams."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
import pytest

from catalog.config import load_snapshot
from pool.http.errors import HttpError
from pool.http.operations import (
    ENDPOINTS,
    build_targets,
    estimate_tokens,
    needs_for,
    parse_request,
    upstream_body,
)
from tests.support.payloads import chat_body

CHAT = ENDPOINTS["/v1/chat/completions"]
MESSAGES = ENDPOINTS["/v1/messages"]
COUNT = ENDPOINTS["/v1/messages/count_tokens"]
RESPONSES = ENDPOINTS["/v1/responses"]


def enc(obj: Any) -> bytes:
    return msgspec.json.encode(obj)


def chat_json(**extra: Any) -> bytes:
    return enc(chat_body("hi", **{"model": "m", **extra}))


def test_a_streaming_chat_with_tools_needs_chat_streaming_and_tool_calling_r_prof_4() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    parsed = parse_request(CHAT, chat_json(stream=True, tools=tools))
    assert parsed.needs == frozenset({"chat", "streaming", "tool_calling"})
    assert parse_request(CHAT, chat_json()).needs == frozenset({"chat"})
    assert parse_request(CHAT, chat_json(tools=[])).needs == frozenset({"chat"})


def test_each_endpoint_needs_its_own_capability() -> None:
    msg = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert parse_request(MESSAGES, enc({**msg, "max_tokens": 5})).needs == {"messages"}
    assert parse_request(COUNT, enc(msg)).needs == {"count_tokens"}
    assert parse_request(RESPONSES, enc({"model": "m", "input": "x", "stream": True})).needs == {
        "responses",
        "streaming",
    }


def test_count_tokens_never_streams() -> None:
    body = enc({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True})
    assert parse_request(COUNT, body).stream is False


def test_needs_sets_are_shared_objects() -> None:
    assert needs_for("chat", True, False) is needs_for("chat", True, False)


def test_the_estimate_is_one_token_per_four_body_bytes_r_pool_7() -> None:
    assert estimate_tokens(b"") == 0
    assert estimate_tokens(b"x" * 4) == 1
    assert estimate_tokens(b"x" * 5) == 2
    body = chat_json()
    assert parse_request(CHAT, body).input_tokens_estimate == (len(body) + 3) // 4


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (enc({"messages": [{"role": "user", "content": "x"}]}), "model"),
        (enc({"model": 5, "messages": [{"role": "user", "content": "x"}]}), "model"),
        (enc({"model": "m"}), "messages"),
        (enc({"model": "m", "messages": []}), "messages"),
        (enc({"model": "m", "messages": "hi"}), "messages"),
        (chat_json(stream="yes"), "stream"),
        (chat_json(tools={"a": 1}), "tools"),
        (chat_json(stream_options=True), "stream_options"),
        (chat_json(api_base="http://evil.example/v1"), "api_base"),
        (chat_json(base_url="http://evil.example/v1"), "base_url"),
        (chat_json(api_key="sk-in-body"), "api_key"),
    ],
)
def test_bad_requests_are_invalid_request_naming_the_field(body: bytes, param: str | None) -> None:
    with pytest.raises(HttpError) as caught:
        parse_request(CHAT, body)
    assert (caught.value.status, caught.value.code, caught.value.param) == (
        400,
        "invalid_request",
        param,
    )


def test_anthropic_messages_need_an_integer_max_tokens() -> None:
    msg = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    for bad in ({}, {"max_tokens": "5"}, {"max_tokens": True}):
        with pytest.raises(HttpError) as caught:
            parse_request(MESSAGES, enc({**msg, **bad}))
        assert caught.value.param == "max_tokens"


def snapshot() -> Any:
    sha = hashlib.sha256(b"node").hexdigest()
    return load_snapshot(
        {
            "edge": {"id": "e", "listen": "127.0.0.1:17000"},
            "admin": {"listen": "127.0.0.1:17001"},
            "openai": {"listen": "127.0.0.1:17002"},
            "protocol_profiles": {
                "aliased": {
                    "base": "openai",
                    "base_url": "http://127.0.0.1:9/v1",
                    "model_mapping": {"short-name": "Org/Long-Name-7B"},
                }
            },
            "nodes": [
                {
                    "id": "n1",
                    "token_hash_sha256": sha,
                    "providers": [
                        {"id": "p-open", "profile": "openai", "base_url": "http://127.0.0.1:9/v1"},
                        {"id": "p-alias", "profile": "aliased"},
                        {"id": "p-oll", "profile": "ollama", "base_url": "http://127.0.0.1:9"},
                    ],
                }
            ],
            "models": [
                {
                    "id": "group",
                    "providers": {
                        "p-open": "served-open",
                        "p-alias": "short-name",
                        "p-oll": "qwen:7b",
                    },
                },
            ],
        }
    )


def test_the_upstream_model_is_the_catalogs_served_name_through_the_profile_mapping() -> None:
    """R-CFG-2 / R-CFG-11: the catalog's served name; R-PROF-5: the profile maps it once."""
    targets = build_targets(snapshot())
    assert targets[("group", "p-open")].model == "served-open"
    assert targets[("group", "p-alias")].model == "Org/Long-Name-7B"
    assert targets[("group", "p-oll")].model == "qwen:7b"
    assert targets[("group", "p-open")].tunnel and not targets[("group", "p-oll")].tunnel


def test_the_upstream_body_carries_the_served_model_and_keeps_everything_else() -> None:
    targets = build_targets(snapshot())
    parsed = parse_request(CHAT, chat_json(temperature=0.5, model="group"))
    sent = msgspec.json.decode(upstream_body(parsed, targets[("group", "p-open")]))
    assert sent == {
        "model": "served-open",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.5,
    }


def test_openai_chat_streams_ask_for_usage_so_it_can_be_metered() -> None:
    targets = build_targets(snapshot())
    parsed = parse_request(CHAT, chat_json(stream=True, stream_options={"other": 1}))
    sent = msgspec.json.decode(upstream_body(parsed, targets[("group", "p-open")]))
    assert sent["stream_options"] == {"other": 1, "include_usage": True}
    # normalized providers and non-stream requests are left alone
    parsed = parse_request(CHAT, chat_json(stream=True))
    assert "stream_options" not in msgspec.json.decode(
        upstream_body(parsed, targets[("group", "p-oll")])
    )
    parsed = parse_request(CHAT, chat_json())
    assert "stream_options" not in msgspec.json.decode(
        upstream_body(parsed, targets[("group", "p-open")])
    )
