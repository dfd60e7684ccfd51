"""Every row of the error table through a real Edge (daphne), a real Node and loopback
upstreams, as the official SDKs and a raw HTTP client see it; streams that fail or lose
their client. Never an HTML page, never a stack trace."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from pool.http.errors import ERRORS
from tests.support import Stack, messages_profile
from tests.support.fixtures import shared_stack
from tests.support.stack import provider_row

pytestmark = pytest.mark.slow

QUEUE_TIMEOUT_MS = 1500  # long enough for a loaded box to send the third request in time
CHAT = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}


def _options(directory: Path) -> dict[str, Any]:
    providers = [
        {"id": "p-main", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 4},
        {
            "id": "p-slow",
            "profile": "openai",
            "base_url": "{up:slow}/v1",
            "capacity": 1,
            "first_byte_timeout_ms": 1000,
        },
        {"id": "p-one", "profile": "openai", "base_url": "{up:slow}/v1", "capacity": 1},
        {"id": "p-off", "profile": "openai", "base_url": "{up:main}/v1", "enabled": False},
        {"id": "p-msg", "profile": "messages_api", "capacity": 2},
    ]
    models = [
        {"id": "gpt-test", "providers": {"p-main": "served-gpt"}},
        {"id": "slow-test", "providers": {"p-slow": "served-slow"}},
        {"id": "one-slot-test", "providers": {"p-one": "served-one"}},
        {"id": "offline-test", "providers": {"p-off": "served-off"}},
        {"id": "claude-test", "providers": {"p-msg": "served-claude"}},
    ]
    return {
        "upstreams": {"main": "openai", "slow": "openai"},
        "providers": providers,
        "models": models,
        "profiles": {"messages_api": messages_profile()},
        "pool": {"max_queue": 1, "queue_timeout_ms": QUEUE_TIMEOUT_MS},
        "openai": {"max_request_bytes": 4096},
    }


stack, _clean_slate = shared_stack("errors", _options)


def assert_error(resp: httpx.Response, code: str) -> dict[str, Any]:
    """A JSON error of the table's status and shape: never HTML, never a trace."""
    assert resp.status_code == ERRORS[code].status, resp.text
    assert resp.headers["content-type"] == "application/json"
    error = resp.json()["error"]
    assert error["code"] == code and error["type"] == ERRORS[code].openai_type
    assert set(error) == {"message", "type", "param", "code"}
    assert "Traceback" not in resp.text
    return error  # type: ignore[no-any-return]


def test_400_invalid_request_for_bad_json_and_missing_fields(
    http: httpx.Client, oai: openai.OpenAI
) -> None:
    assert_error(http.post("/v1/chat/completions", content=b"{not json"), "invalid_request")
    error = assert_error(
        http.post("/v1/chat/completions", json={"model": "gpt-test"}), "invalid_request"
    )
    assert error["param"] == "messages"
    error = assert_error(
        http.post("/v1/chat/completions", json={**CHAT, "base_url": "http://127.0.0.1:1/v1"}),
        "invalid_request",
    )
    assert error["param"] == "base_url"
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model="gpt-test", messages=[])
    assert caught.value.code == "invalid_request"


def test_401_invalid_api_key_in_both_shapes(stack: Stack) -> None:
    with (
        openai.OpenAI(base_url=stack.v1_url, api_key="wrong", max_retries=0) as client,
        pytest.raises(openai.AuthenticationError) as caught,
    ):
        client.models.list()
    assert caught.value.code == "invalid_api_key"
    with (
        anthropic.Anthropic(base_url=stack.openai_url, api_key="wrong", max_retries=0) as ant,
        pytest.raises(anthropic.AuthenticationError) as refused,
    ):
        ant.messages.create(
            model="gpt-test", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_404_model_not_found(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        oai.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.code == "model_not_found"
    assert caught.value.param == "model"  # docs/http-api.md
    assert "GET /v1/models" in caught.value.message


def test_400_unsupported_operation_when_no_provider_has_the_capability(
    stack: Stack, ant: anthropic.Anthropic
) -> None:
    """R-PROF-4: the openai profile declares no ``messages`` capability."""
    with pytest.raises(anthropic.BadRequestError) as caught:
        ant.messages.create(
            model="gpt-test", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.body == {
        "type": "error",
        "error": {  # the Anthropic shape; the message names the missing capability
            "type": "invalid_request_error",
            "message": 'no provider of the model "gpt-test" has the capabilities this request '
            "needs (messages); use another model (GET /v1/models lists the models)",
        },
    }
    assert stack.upstream().server.requests == []


def test_413_request_too_large_declared_or_chunked(stack: Stack, http: httpx.Client) -> None:
    big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}).encode()
    assert_error(http.post("/v1/chat/completions", content=big), "request_too_large")

    def chunked() -> Iterator[bytes]:  # no Content-Length: Transfer-Encoding: chunked
        for i in range(0, len(big), 1000):
            yield big[i : i + 1000]

    assert_error(http.post("/v1/chat/completions", content=chunked()), "request_too_large")
    assert stack.upstream().server.requests == []  # nothing was dispatched


def test_503_no_available_provider(http: httpx.Client) -> None:
    assert_error(
        http.post("/v1/chat/completions", json={**CHAT, "model": "offline-test"}),
        "no_available_provider",
    )


def test_502_upstream_error_carries_the_upstream_status(stack: Stack, http: httpx.Client) -> None:
    stack.upstream().server.faults.status = 500
    error = assert_error(http.post("/v1/chat/completions", json=CHAT), "upstream_error")
    assert "HTTP 500" in error["message"]


def test_504_upstream_timeout(stack: Stack, http: httpx.Client) -> None:
    stack.upstream("slow").server.faults.stall_before_first_byte = 5.0  # > 1 s first byte
    assert_error(
        http.post("/v1/chat/completions", json={**CHAT, "model": "slow-test"}), "upstream_timeout"
    )


async def test_429_queue_full_with_retry_after_then_503_queue_timeout(stack: Stack) -> None:
    """R-POOL-4: one provider slot, a queue of one; the third request is refused at once."""
    stack.upstream("slow").server.faults.stall_before_first_byte = math.inf
    body = {**CHAT, "model": "one-slot-test"}
    headers = {"authorization": f"Bearer {stack.token}"}
    async with httpx.AsyncClient(base_url=stack.openai_url, timeout=20, headers=headers) as client:
        holder = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        await stack.until(
            lambda s: provider_row(s, "p-one")["in_flight"] == 1, "p-one busy", within=5.0
        )
        waiter = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        await stack.until(lambda s: s["queue_depth"] == 1, "one waiter queued", within=5.0)
        full = await client.post("/v1/chat/completions", json=body)
        assert_error(full, "queue_full")
        assert full.headers["retry-after"] == "1"
        assert_error(await waiter, "queue_timeout")
        holder.cancel()  # the client goes away: the run is cancelled, the slot freed
        with pytest.raises(asyncio.CancelledError):
            await holder
    assert stack.upstream("slow").wait_disconnect()


def test_a_mid_stream_failure_ends_the_stream_with_an_error_event(
    stack: Stack, oai: openai.OpenAI
) -> None:
    stack.upstream().server.faults.drop_mid_stream = True
    received = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in oai.chat.completions.create(stream=True, **CHAT):  # type: ignore[call-overload]
            received.append(chunk)
    assert len(received) == 1  # the first chunk arrived, then the error: never a silent end
    assert caught.value.body["code"] == "upstream_error"  # type: ignore[index]


def test_a_mid_stream_failure_on_messages_is_an_anthropic_error_event(
    stack: Stack, ant: anthropic.Anthropic
) -> None:
    stack.upstream().server.faults.drop_mid_stream = True
    events = []
    request = {
        "model": "claude-test",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "x"}],
    }
    with pytest.raises(anthropic.APIStatusError) as caught, ant.messages.stream(**request) as s:
        events.extend(s)
    assert [e.type for e in events] == ["message_start"]
    assert caught.value.body["error"]["type"] == "api_error"  # type: ignore[index]


def test_a_client_leaving_mid_stream_cancels_the_upstream_and_frees_the_slot(
    stack: Stack, oai: openai.OpenAI
) -> None:
    """R-POOL-9: the upstream sees the disconnect and the provider's in_flight is 0 again."""
    stack.upstream().server.faults.stall_mid_stream = math.inf
    stream = oai.chat.completions.create(stream=True, **CHAT)  # type: ignore[call-overload]
    first = next(iter(stream))
    assert first.choices[0].delta.role == "assistant"
    assert stack.provider("p-main")["in_flight"] == 1
    stream.close()
    assert stack.upstream().wait_disconnect(), "the upstream never saw the client leave"
    stack.wait_idle(timeout=5)
    assert stack.provider("p-main")["in_flight"] == 0


def test_unknown_paths_and_methods_are_json_too(http: httpx.Client) -> None:
    assert_error(http.post("/v1/embeddings", json=CHAT), "not_found")
    assert_error(http.get("/v1/chat/completions"), "method_not_allowed")
