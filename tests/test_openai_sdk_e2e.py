"""The official OpenAI and Anthropic SDKs against a real Edge (daphne), a real Node and a
loopback upstream: chat (stream and not), tools, Responses, Messages, count_tokens, models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support import Stack, messages_profile

pytestmark = pytest.mark.slow

PROVIDER_KEY = "sk-canary-provider-key-5b1e9d"  # must reach the upstream and nowhere else
METRICS_TOKEN = "metrics-canary-token-77c2"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    providers = [
        {
            "id": "p-openai",
            "profile": "openai",
            "base_url": "{up:main}/v1",
            "capacity": 4,
            "credential": {"env": "IOP_TEST_PROVIDER_KEY"},
        },
        {
            "id": "p-anthropic",
            "profile": "messages_api",
            "capacity": 4,
            "credential": {"env": "IOP_TEST_PROVIDER_KEY"},
        },
    ]
    models = [
        {"id": "gpt-test", "providers": {"p-openai": "served-gpt"}},
        {"id": "claude-test", "providers": {"p-anthropic": "served-claude"}},
    ]
    with Stack(
        tmp_path_factory.mktemp("sdk"),
        providers=providers,
        models=models,
        profiles={"messages_api": messages_profile()},
        openai={
            "metrics_token": {"env": "IOP_TEST_METRICS_TOKEN"},
            "provider_auth": {"enabled": True, "required": False},
        },
        env={"IOP_TEST_PROVIDER_KEY": PROVIDER_KEY, "IOP_TEST_METRICS_TOKEN": METRICS_TOKEN},
        log_level="DEBUG",
    ) as running:
        yield running


@pytest.fixture(autouse=True)
def idle_after(stack: Stack) -> Iterator[None]:
    with stack.clean_slate():
        yield


def upstream_requests(stack: Stack, path: str) -> list[Any]:
    return [r for r in stack.upstream().server.requests if r.path == path]


def test_non_stream_chat_returns_the_upstream_answer(stack: Stack, oai: openai.OpenAI) -> None:
    reply = oai.chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "hello"}]
    )
    assert reply.choices[0].message.content == stack.upstream().server.reply_text
    assert reply.usage is not None and reply.usage.prompt_tokens == 11
    assert reply.model == "gpt-test"  # the name the client asked for, not the served one
    (sent,) = upstream_requests(stack, "/v1/chat/completions")
    assert sent.json["model"] == "served-gpt"  # R-CFG-2: the served name goes upstream
    assert sent.headers["authorization"] == f"Bearer {PROVIDER_KEY}"


def test_streamed_chat_text_equals_the_upstream_text(stack: Stack, oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "hello"}], stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == stack.upstream().server.reply_text
    assert chunks[-1].usage is not None  # include_usage was asked for, so usage is metered
    assert {c.model for c in chunks} == {"gpt-test"}  # every chunk names the asked model
    (sent,) = upstream_requests(stack, "/v1/chat/completions")
    assert sent.json["stream_options"] == {"include_usage": True}


def test_a_tool_call_round_trip(stack: Stack, oai: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
    first = oai.chat.completions.create(model="gpt-test", messages=messages, tools=[WEATHER_TOOL])
    (call,) = first.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    final = oai.chat.completions.create(
        model="gpt-test", messages=messages, tools=[WEATHER_TOOL], tool_choice="none"
    )
    assert final.choices[0].message.content == stack.upstream().server.reply_text
    second = upstream_requests(stack, "/v1/chat/completions")[1].json
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": call.id, "content": "sunny"}
    # the same call, streamed: the argument fragments arrive in order
    stream = oai.chat.completions.create(
        model="gpt-test", messages=messages[:1], tools=[WEATHER_TOOL], stream=True
    )
    arguments = "".join(
        tc.function.arguments or ""
        for chunk in stream
        if chunk.choices
        for tc in chunk.choices[0].delta.tool_calls or []
        if tc.function
    )
    assert json.loads(arguments) == {"city": "Paris"}


def test_responses_stream_and_not(stack: Stack, oai: openai.OpenAI) -> None:
    reply = oai.responses.create(model="gpt-test", input="hello")
    assert reply.output_text == stack.upstream().server.reply_text
    assert reply.model == "gpt-test"
    events = list(oai.responses.create(model="gpt-test", input="hi", stream=True))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    named = {e.response.model for e in events if hasattr(e, "response")}
    assert named == {"gpt-test"}
    assert "".join(deltas) == stack.upstream().server.reply_text
    assert [r.json["model"] for r in upstream_requests(stack, "/v1/responses")] == [
        "served-gpt",
        "served-gpt",
    ]


def test_anthropic_messages_stream_and_not(stack: Stack, ant: anthropic.Anthropic) -> None:
    reply = ant.messages.create(
        model="claude-test", max_tokens=64, messages=[{"role": "user", "content": "hello"}]
    )
    assert reply.content[0].text == stack.upstream().server.reply_text  # type: ignore[union-attr]
    assert reply.model == "claude-test"
    with ant.messages.stream(
        model="claude-test", max_tokens=64, messages=[{"role": "user", "content": "hello"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == stack.upstream().server.reply_text
    assert final.model == "claude-test"  # from the stream's message_start
    sent = upstream_requests(stack, "/v1/messages")
    assert [r.json["model"] for r in sent] == ["served-claude", "served-claude"]
    assert sent[0].headers["x-api-key"] == PROVIDER_KEY  # the profile's auth header


def test_count_tokens(stack: Stack, ant: anthropic.Anthropic) -> None:
    counted = ant.messages.count_tokens(
        model="claude-test", messages=[{"role": "user", "content": "hello"}]
    )
    assert counted.input_tokens == stack.upstream().server.prompt_tokens
    (sent,) = upstream_requests(stack, "/v1/messages/count_tokens")
    assert sent.json["model"] == "served-claude"


def test_models_are_the_catalog_groups_for_both_sdks_r_cfg_11(
    stack: Stack, oai: openai.OpenAI, ant: anthropic.Anthropic
) -> None:
    assert [m.id for m in oai.models.list()] == ["claude-test", "gpt-test"]
    assert [m.id for m in ant.models.list()] == ["claude-test", "gpt-test"]
    assert oai.models.retrieve("gpt-test").id == "gpt-test"
    assert stack.upstream().server.requests == []  # never the provider's own /models


def test_legacy_provider_auth_forwards_the_callers_key_r_auth_2(stack: Stack) -> None:
    with openai.OpenAI(
        base_url=stack.v1_url,
        api_key=stack.token,
        max_retries=0,
        default_headers={"X-IOP-Provider-Authorization": "sk-caller-own"},
    ) as client:
        client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "x"}]
        )
    (sent,) = upstream_requests(stack, "/v1/chat/completions")
    assert sent.headers["authorization"] == "Bearer sk-caller-own"
    assert stack.token not in json.dumps(sent.headers) + sent.body.decode()


def test_canary_secrets_never_appear_in_logs_responses_or_metrics(stack: Stack) -> None:
    """R-REF-6 / R-AUTH-6: the caller token and the provider key stay out of every output."""
    wrong = "iop-canary-wrong-token-" + "9" * 12
    seen: list[str] = []
    with httpx.Client(base_url=stack.openai_url, timeout=20) as http:
        good = {"authorization": f"Bearer {stack.token}"}
        body = {"model": "gpt-test", "messages": [{"role": "user", "content": "x"}]}
        seen.append(http.post("/v1/chat/completions", json=body, headers=good).text)
        seen.append(
            http.post("/v1/chat/completions", json={**body, "stream": True}, headers=good).text
        )
        seen.append(
            http.post(
                "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {wrong}"}
            ).text
        )
        seen.append(
            http.post("/v1/chat/completions", json={**body, "model": "nope"}, headers=good).text
        )
        stack.upstream().server.faults.status = 401
        stack.upstream().server.faults.error_message = f"bad key {PROVIDER_KEY}"
        failed = http.post("/v1/chat/completions", json=body, headers=good)
        assert failed.status_code == 502
        seen.append(failed.text)
        scrape = http.get("/metrics", headers={"authorization": f"Bearer {METRICS_TOKEN}"})
        assert scrape.status_code == 200 and "iop_requests" in scrape.text
        seen.append(scrape.text)
    seen.append(stack.metrics_text())
    stack.wait_idle()
    outputs = "\n".join(seen) + stack.logs() + json.dumps(stack.pool_snapshot())
    for canary in (stack.token, wrong, PROVIDER_KEY, METRICS_TOKEN):
        assert canary not in outputs
    assert any(
        r.headers.get("authorization") == f"Bearer {PROVIDER_KEY}"
        for r in stack.upstream().server.requests
    )  # the key was really in play
    logs = Path(stack.dir / "edge.log").read_text()
    assert "Traceback" not in logs
