"""The openai_compat passthrough adapter against a loopback fake upstream."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import msgspec
import pytest

from nodes import wire
from nodes.agent.adapters.base import AdapterError, RunSpec
from nodes.agent.adapters.http import retry_after_s
from nodes.agent.adapters.openai_compat import OpenAICompatAdapter
from tests.support.payloads import chat_body, openai_provider

SECRET = "sk-test-credential-abcdef123456"


def spec(operation: str, body: object, *, stream: bool = False, **kw: object) -> RunSpec:
    raw = b"" if body is None else msgspec.json.encode(body)
    return RunSpec(run_id="r1", operation=operation, stream=stream, body=raw, **kw)  # type: ignore[arg-type]


class Sink:
    """Collects emitted text; ``first`` is set on the first emit."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.first = asyncio.Event()

    async def __call__(self, text: str) -> None:
        self.parts.append(text)
        self.first.set()

    @property
    def text(self) -> str:
        return "".join(self.parts)


async def test_chat_stream_relays_upstream_text_exactly_and_reads_usage(
    fake_openai, upstream_client
):
    fake_openai.reply_text = "Héllo wörld — 你好 \u2028 emoji 🎉 end"
    fake_openai.prompt_tokens, fake_openai.completion_tokens = 23, 9
    adapter = OpenAICompatAdapter(openai_provider(fake_openai.url), upstream_client)
    sink = Sink()
    body = chat_body(stream=True, stream_options={"include_usage": True})
    usage = await adapter.run(spec("chat_completions", body, stream=True), sink)
    assert sink.text == fake_openai.requests[0].response.decode()
    assert usage == wire.Usage(input_tokens=23, output_tokens=9)
    assert fake_openai.requests[0].json == body  # the body went upstream as is


async def test_chat_stream_chunks_are_relayed_before_the_upstream_finishes(
    fake_openai, upstream_client
):
    fake_openai.faults.stall_mid_stream = math.inf
    adapter = OpenAICompatAdapter(openai_provider(fake_openai.url), upstream_client)
    sink = Sink()
    task = asyncio.create_task(
        adapter.run(spec("chat_completions", chat_body(stream=True), stream=True), sink)
    )
    async with asyncio.timeout(5):
        await sink.first.wait()
    assert "chat.completion.chunk" in sink.text
    assert not task.done() and fake_openai.current == 1  # upstream still mid-response
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_chat_non_stream_with_tool_call_returns_body_and_usage(fake_openai, upstream_client):
    fake_openai.prompt_tokens, fake_openai.completion_tokens = 31, 4
    adapter = OpenAICompatAdapter(openai_provider(fake_openai.url), upstream_client)
    sink = Sink()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    usage = await adapter.run(spec("chat_completions", chat_body(tools=tools)), sink)
    reply = json.loads(sink.text)
    assert sink.text == fake_openai.requests[0].response.decode()
    call = reply["choices"][0]["message"]["tool_calls"][0]
    assert call["function"] == {"name": "get_weather", "arguments": fake_openai.tool_arguments}
    assert usage == wire.Usage(input_tokens=31, output_tokens=4)


async def test_chat_stream_with_tool_calls_is_relayed_unchanged(fake_openai, upstream_client):
    adapter = OpenAICompatAdapter(openai_provider(fake_openai.url), upstream_client)
    sink = Sink()
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    await adapter.run(
        spec("chat_completions", chat_body(stream=True, tools=tools), stream=True), sink
    )
    assert sink.text == fake_openai.requests[0].response.decode()
    assert '"finish_reason":"tool_calls"' in sink.text


async def test_responses_stream_usage_comes_from_response_completed(fake_openai, upstream_client):
    fake_openai.prompt_tokens, fake_openai.completion_tokens = 17, 6
    adapter = OpenAICompatAdapter(
        openai_provider(fake_openai.url, driver="openai_responses"), upstream_client
    )
    sink = Sink()
    body = {"model": "fake-model", "input": "hi", "stream": True}
    usage = await adapter.run(spec("responses", body, stream=True), sink)
    assert sink.text == fake_openai.requests[0].response.decode()
    assert usage == wire.Usage(input_tokens=17, output_tokens=6)


async def test_responses_non_stream_usage(fake_openai, upstream_client):
    fake_openai.prompt_tokens, fake_openai.completion_tokens = 5, 3
    adapter = OpenAICompatAdapter(
        openai_provider(fake_openai.url, driver="openai_responses"), upstream_client
    )
    usage = await adapter.run(spec("responses", {"model": "m", "input": "hi"}), Sink())
    assert usage == wire.Usage(input_tokens=5, output_tokens=3)


async def test_anthropic_stream_usage_from_message_start_and_message_delta(
    fake_openai, upstream_client
):
    fake_openai.prompt_tokens, fake_openai.completion_tokens = 40, 12
    provider = openai_provider(fake_openai.url, driver="anthropic_messages")
    adapter = OpenAICompatAdapter(provider, upstream_client)
    sink = Sink()
    body = {
        "model": "claude",
        "max_tokens": 64,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    usage = await adapter.run(spec("messages", body, stream=True), sink)
    assert sink.text == fake_openai.requests[0].response.decode()
    assert "event: message_start" in sink.text
    assert usage == wire.Usage(input_tokens=40, output_tokens=12)


async def test_anthropic_non_stream_and_count_tokens(fake_openai, upstream_client):
    fake_openai.prompt_tokens, fake_openai.completion_tokens = 8, 2
    adapter = OpenAICompatAdapter(
        openai_provider(fake_openai.url, driver="anthropic_messages"), upstream_client
    )
    body = {"model": "claude", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
    assert await adapter.run(spec("messages", body), Sink()) == wire.Usage(
        input_tokens=8, output_tokens=2
    )
    sink = Sink()
    assert await adapter.run(spec("count_tokens", body), sink) is None  # not a generation
    assert json.loads(sink.text) == {"input_tokens": 8}
    assert fake_openai.requests[-1].path == "/v1/messages/count_tokens"


async def test_models_operation_is_a_get_without_usage(fake_openai, upstream_client):
    adapter = OpenAICompatAdapter(openai_provider(fake_openai.url), upstream_client)
    sink = Sink()
    assert await adapter.run(spec("models", None), sink) is None
    assert fake_openai.requests[0].method == "GET"
    assert [m["id"] for m in json.loads(sink.text)["data"]] == fake_openai.models


async def test_operation_the_provider_lacks_is_bad_request(fake_openai, upstream_client):
    adapter = OpenAICompatAdapter(
        openai_provider(fake_openai.url, driver="openai_responses"), upstream_client
    )
    with pytest.raises(AdapterError) as err:
        await adapter.run(spec("messages", {}), Sink())
    assert err.value.code == "bad_request"
    assert fake_openai.requests == []


async def test_large_sse_line_is_relayed_intact(fake_openai, upstream_client):
    fake_openai.reply_text = "x" * 400_000  # one 400 kB data: line (over aiohttp's 128 KiB)
    adapter = OpenAICompatAdapter(openai_provider(fake_openai.url), upstream_client)
    sink = Sink()
    await adapter.run(spec("chat_completions", chat_body(stream=True), stream=True), sink)
    assert sink.text == fake_openai.requests[0].response.decode()


async def test_non_2xx_is_upstream_error_with_status_and_the_upstream_message_in_the_detail(
    fake_openai, upstream_client
):
    fake_openai.faults.status = 503
    fake_openai.faults.error_message = "overloaded, try later"
    adapter = OpenAICompatAdapter(openai_provider(fake_openai.url), upstream_client)
    with pytest.raises(AdapterError) as err:
        await adapter.run(spec("chat_completions", chat_body()), Sink())
    assert err.value.code == "upstream_error"
    assert err.value.status == 503
    assert err.value.retryable is True
    assert err.value.message == "upstream returned HTTP 503"
    where = fake_openai.url.split("//", 1)[1].split("/", 1)[0]
    assert err.value.detail == f"{where} upstream returned HTTP 503: overloaded, try later"


async def test_upstream_error_detail_is_truncated_to_300_chars(fake_openai, upstream_client):
    fake_openai.faults.status = 400
    fake_openai.faults.error_message = "y" * 1000
    adapter = OpenAICompatAdapter(openai_provider(fake_openai.url), upstream_client)
    with pytest.raises(AdapterError) as err:
        await adapter.run(spec("chat_completions", chat_body()), Sink())
    assert err.value.detail.count("y") == 300
    assert (err.value.status, err.value.retryable) == (400, False)


async def test_first_byte_timeout_is_upstream_timeout_and_closes_upstream(
    fake_openai, upstream_client
):
    fake_openai.faults.stall_before_first_byte = math.inf
    adapter = OpenAICompatAdapter(
        openai_provider(fake_openai.url, first_byte_timeout_s=0.3), upstream_client
    )
    with pytest.raises(AdapterError) as err:
        await adapter.run(spec("chat_completions", chat_body(stream=True), stream=True), Sink())
    assert err.value.code == "upstream_timeout"
    async with asyncio.timeout(5):
        await fake_openai.disconnected.wait()


async def test_idle_timeout_mid_stream_is_upstream_timeout(fake_openai, upstream_client):
    fake_openai.faults.stall_mid_stream = math.inf
    provider = openai_provider(fake_openai.url, first_byte_timeout_s=5, idle_timeout_s=0.3)
    adapter = OpenAICompatAdapter(provider, upstream_client)
    sink = Sink()
    with pytest.raises(AdapterError) as err:
        await adapter.run(spec("chat_completions", chat_body(stream=True), stream=True), sink)
    assert err.value.code == "upstream_timeout"
    assert "idle" in err.value.message
    assert sink.parts  # the first chunk had been relayed
    async with asyncio.timeout(5):
        await fake_openai.disconnected.wait()


async def test_cancelling_a_run_closes_the_upstream_connection(fake_openai, upstream_client):
    fake_openai.faults.stall_mid_stream = math.inf
    adapter = OpenAICompatAdapter(openai_provider(fake_openai.url), upstream_client)
    sink = Sink()
    task = asyncio.create_task(
        adapter.run(spec("chat_completions", chat_body(stream=True), stream=True), sink)
    )
    async with asyncio.timeout(5):
        await sink.first.wait()
    assert not fake_openai.disconnected.is_set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(5):
        await fake_openai.disconnected.wait()


async def test_connection_dropped_mid_stream_is_upstream_error(fake_openai, upstream_client):
    fake_openai.faults.drop_mid_stream = True
    adapter = OpenAICompatAdapter(openai_provider(fake_openai.url), upstream_client)
    with pytest.raises(AdapterError) as err:
        await adapter.run(spec("chat_completions", chat_body(stream=True), stream=True), Sink())
    assert err.value.code == "upstream_error"
    assert err.value.retryable is False  # output had started


async def test_connection_refused_is_a_retryable_upstream_error(upstream_client):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    adapter = OpenAICompatAdapter(openai_provider(f"http://127.0.0.1:{port}"), upstream_client)
    with pytest.raises(AdapterError) as err:
        await adapter.run(spec("chat_completions", chat_body()), Sink())
    assert (err.value.code, err.value.retryable) == ("upstream_error", True)
    assert err.value.message == "cannot connect to the upstream"
    assert err.value.detail == f"upstream 127.0.0.1:{port}: ClientConnectorError"
    # R-HEALTH-1: never reached; the reason shown in /pool has no address either
    assert err.value.phase == wire.PHASE_CONNECT
    assert err.value.to_wire().reason == "cannot connect to the upstream"


async def test_bearer_credential_from_env_goes_in_authorization_and_never_in_logs(
    fake_openai, upstream_client, monkeypatch, caplog
):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("FAKE_PROVIDER_KEY", SECRET)
    fake_openai.faults.status = 401
    fake_openai.faults.error_message = f"Incorrect API key provided: {SECRET}"
    provider = openai_provider(
        fake_openai.url,
        auth=wire.AuthPayload(type="bearer"),
        credential=wire.SecretRefPayload(env="FAKE_PROVIDER_KEY"),
    )
    adapter = OpenAICompatAdapter(provider, upstream_client)
    with pytest.raises(AdapterError) as err:
        await adapter.run(spec("chat_completions", chat_body()), Sink())
    assert fake_openai.requests[0].headers["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in err.value.message and SECRET not in err.value.detail  # redacted
    assert SECRET not in caplog.text


@pytest.mark.parametrize(("scheme", "expected"), [("", SECRET), ("Token", f"Token {SECRET}")])
async def test_header_auth_puts_the_credential_in_the_named_header(
    fake_openai, upstream_client, tmp_path, scheme, expected
):
    key_file = tmp_path / "key"
    key_file.write_text(SECRET + "\n")
    provider = openai_provider(
        fake_openai.url,
        driver="anthropic_messages",
        auth=wire.AuthPayload(type="header", header="x-api-key", scheme=scheme),
        credential=wire.SecretRefPayload(file=str(key_file)),
        headers={"anthropic-version": "2023-06-01"},
    )
    await OpenAICompatAdapter(provider, upstream_client).run(
        spec("count_tokens", {"model": "m"}), Sink()
    )
    headers = fake_openai.requests[0].headers
    assert headers["x-api-key"] == expected
    assert headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in headers


async def test_forwarded_caller_credential_replaces_the_configured_one(
    fake_openai, upstream_client, monkeypatch
):
    """R-AUTH-2: a legacy caller provider token arrives in forward_headers."""
    monkeypatch.setenv("FAKE_PROVIDER_KEY", SECRET)
    provider = openai_provider(
        fake_openai.url,
        auth=wire.AuthPayload(type="bearer"),
        credential=wire.SecretRefPayload(env="FAKE_PROVIDER_KEY"),
    )
    request = spec(
        "chat_completions", chat_body(), forward_headers={"authorization": "Bearer caller-key"}
    )
    await OpenAICompatAdapter(provider, upstream_client).run(request, Sink())
    assert fake_openai.requests[0].headers["authorization"] == "Bearer caller-key"


async def test_the_body_goes_upstream_as_the_edge_mapped_it_never_mapped_again(
    fake_openai, upstream_client
):
    """R-PROF-5: the Edge maps the model once; a body whose model is itself a mapping key
    (a chained mapping ``a: b``, ``b: c``) is not mapped a second time on the Node."""
    provider = openai_provider(fake_openai.url, model_mapping={"a": "b", "b": "c"})
    adapter = OpenAICompatAdapter(provider, upstream_client)
    await adapter.run(spec("chat_completions", chat_body(model="b")), Sink())
    assert [r.json["model"] for r in fake_openai.requests] == ["b"]


async def test_operation_urls_are_used_exactly_as_compiled(fake_openai, upstream_client):
    """R-PROF-6: the Node posts to the complete URL the Edge compiled, unchanged."""
    provider = openai_provider(fake_openai.url)
    provider.operations["chat_completions"] = fake_openai.url + "/v1/chat/completions?api-version=1"
    await OpenAICompatAdapter(provider, upstream_client).run(
        spec("chat_completions", chat_body()), Sink()
    )
    assert fake_openai.requests[0].path == "/v1/chat/completions"


async def test_concurrent_runs_share_one_session_without_a_cap(fake_openai, upstream_client):
    fake_openai.faults.hold_mid_stream = hold = asyncio.Event()
    adapter = OpenAICompatAdapter(openai_provider(fake_openai.url), upstream_client)
    runs = [
        asyncio.create_task(
            adapter.run(spec("chat_completions", chat_body(stream=True), stream=True), Sink())
        )
        for _ in range(12)
    ]
    await fake_openai.wait_concurrent(12)  # all twelve are mid-stream at once
    hold.set()
    await asyncio.gather(*runs)
    assert fake_openai.peak == 12


async def test_r_xlate_3_anthropic_driver_sends_the_version_header_the_api_requires(
    fake_anthropic, upstream_client
):
    """R-XLATE-3: the anthropic_messages driver sends ``anthropic-version`` even when the
    provider's payload carries no header, and a real-shaped Messages API accepts the call."""
    provider = openai_provider(fake_anthropic.url, driver="anthropic_messages")
    assert "anthropic-version" not in {k.lower() for k in provider.headers}
    adapter = OpenAICompatAdapter(provider, upstream_client)
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    sink = Sink()
    usage = await adapter.run(spec("messages", body), sink)
    assert fake_anthropic.requests[0].headers["anthropic-version"] == "2023-06-01"
    assert json.loads(sink.text)["content"][0]["type"] == "text"
    expected = (fake_anthropic.input_tokens, fake_anthropic.output_tokens)
    assert usage == wire.Usage(input_tokens=expected[0], output_tokens=expected[1])


async def test_fake_anthropic_refuses_a_request_without_the_version_header(
    fake_anthropic, upstream_client
):
    """R-XLATE-3: the fake refuses as the real API does, so the header cannot regress."""
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    url = fake_anthropic.url + "/v1/messages"
    async with upstream_client.session().post(url, json=body) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("faults", "phase"),
    [
        ({"status": 502}, wire.PHASE_BEFORE_FIRST_BYTE),
        ({"reset_before_headers": True}, wire.PHASE_BEFORE_FIRST_BYTE),
        ({"drop_mid_stream": True}, wire.PHASE_AFTER_FIRST_BYTE),
    ],
    ids=["http-502", "reset-mid-headers", "dropped-mid-stream"],
)
async def test_each_failure_says_how_far_the_run_got_r_health_1(
    fake_openai, upstream_client, faults, phase
):
    for key, value in faults.items():
        setattr(fake_openai.faults, key, value)
    adapter = OpenAICompatAdapter(openai_provider(fake_openai.url), upstream_client)
    with pytest.raises(AdapterError) as err:
        await adapter.run(spec("chat_completions", chat_body(stream=True), stream=True), Sink())
    assert err.value.phase == phase
    assert err.value.retryable is (phase == wire.PHASE_BEFORE_FIRST_BYTE)


@pytest.mark.parametrize(
    ("retry_after", "seconds"), [("30", 30.0), (None, None), ("soon", None), ("99999", 3600.0)]
)
async def test_a_429_reports_its_retry_after_bounded_r_health_2(
    fake_openai, upstream_client, retry_after, seconds
):
    fake_openai.faults.status = 429
    fake_openai.faults.retry_after = retry_after
    adapter = OpenAICompatAdapter(openai_provider(fake_openai.url), upstream_client)
    with pytest.raises(AdapterError) as err:
        await adapter.run(spec("chat_completions", chat_body()), Sink())
    assert (err.value.status, err.value.retryable) == (429, True)
    assert err.value.retry_after_s == seconds


def test_retry_after_as_an_http_date_counts_from_now() -> None:
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    seconds = retry_after_s(when)
    assert seconds is not None and 100 < seconds <= 120
    past = format_datetime(datetime.now(UTC) - timedelta(seconds=120), usegmt=True)
    assert retry_after_s(past) == 0.0


async def test_a_tls_handshake_failure_is_in_the_connect_phase_r_health_1(
    fake_openai, upstream_client
):
    """R-HEALTH-1: https to a plain-HTTP upstream fails the handshake: never reached."""
    url = fake_openai.url.replace("http://", "https://")
    adapter = OpenAICompatAdapter(openai_provider(url), upstream_client)
    with pytest.raises(AdapterError) as err:
        await adapter.run(spec("chat_completions", chat_body()), Sink())
    assert (err.value.retryable, err.value.phase) == (True, wire.PHASE_CONNECT)
    assert fake_openai.requests == []
