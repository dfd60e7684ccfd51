"""OpenAIApp in process (tests.support.inprocess: a real pool and NodeHub, a scripted Node,
a daphne-like ASGI driver). Fast checks of dispatch, relay, disconnects and error paths."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest

from nodes import wire
from obskit.logs import HumanFormatter, JsonFormatter
from pool.http import relay
from pool.http.app import OpenAIApp
from pool.http.errors import ERRORS
from tests.support.inprocess import TOKEN, WAIT, FakeNode, Runtime, api, chat, document, until


def row(runtime: Runtime, provider_id: str) -> Any:
    (found,) = [p for p in runtime.pool.snapshot().providers if p.provider_id == provider_id]
    return found


@pytest.fixture
async def edge() -> Any:
    runtime = Runtime(document())
    node = await FakeNode(runtime.hub).start()
    app = OpenAIApp(runtime)
    yield app, runtime, node
    await runtime.hub.aclose()
    assert runtime.pool.idle(), "every lease released and no waiter left (R-POOL-9)"


async def test_non_stream_chat_relays_the_body_and_meters_once(edge: Any) -> None:
    app, runtime, node = edge
    call = await api(app, "POST", "/v1/chat/completions", chat()).done()
    assert call.status == 200 and call.body == b'{"ok":true}'
    assert call.headers[b"content-type"] == b"application/json"
    run = node.runs[0]
    assert isinstance(run, wire.TunnelRequest) and run.operation == "chat_completions"
    assert msgspec.json.decode(run.body)["model"] == "served-gpt"
    (record,) = runtime.meter.records
    assert (record.operation, record.model_group, record.provider_id) == (
        "chat_completions",
        "gpt",
        "p-open",
    )
    assert (record.principal_ref, record.token_ref, record.status, record.code) == (
        "team-a",
        "app-a",
        200,
        None,
    )
    assert (record.input_tokens, record.output_tokens, record.estimated) == (3, 2, False)


async def test_the_callers_edge_token_is_never_sent_to_the_node(edge: Any) -> None:
    app, _, node = edge
    await api(app, "POST", "/v1/chat/completions", chat(stream=True)).done()
    assert node.frames and all(TOKEN.encode() not in frame for frame in node.frames)


async def test_stream_relays_in_order_with_sse_headers(edge: Any) -> None:
    app, runtime, node = edge

    async def slow(node: FakeNode, run: Any) -> None:
        await node.emit(run.run_id, "data: one\n\n")
        await node.release.wait()
        await node.emit(run.run_id, "data: two\n\n")
        await node.end(run.run_id)

    node.script = slow
    call = api(app, "POST", "/v1/chat/completions", chat(stream=True))
    # the first chunk reaches the client while the run is still going
    await call.wait_for(lambda: b"data: one\n\n" in call.body)
    node.release.set()
    await call.done()
    assert call.status == 200
    assert call.headers[b"content-type"] == b"text/event-stream"
    assert call.headers[b"cache-control"] == b"no-cache"
    assert call.body == b"data: one\n\ndata: two\n\n"
    assert runtime.meter.records[0].stream is True


async def test_chunks_already_queued_go_out_in_one_send(edge: Any) -> None:
    app, _, node = edge

    async def burst(node: FakeNode, run: Any) -> None:
        for i in range(5):
            await node.emit(run.run_id, f"data: {i}\n\n")  # no suspension between them
        await node.end(run.run_id)

    node.script = burst
    call = await api(app, "POST", "/v1/chat/completions", chat(stream=True)).done()
    assert call.bodies == [b"".join(f"data: {i}\n\n".encode() for i in range(5))]


async def test_a_mid_stream_failure_ends_with_an_in_band_openai_error_event(edge: Any) -> None:
    app, runtime, node = edge

    async def breaks(node: FakeNode, run: Any) -> None:
        await node.emit(run.run_id, "data: partial\n\n")
        await asyncio.sleep(0)
        await node.end(
            run.run_id,
            ok=False,
            error=wire.RunError(
                code="upstream_error", message="upstream closed the connection mid-response"
            ),
        )

    node.script = breaks
    call = await api(app, "POST", "/v1/chat/completions", chat(stream=True)).done()
    assert call.status == 200
    head, _, last = call.body.rstrip(b"\n").rpartition(b"\n\n")
    assert head == b"data: partial"
    event = json.loads(last.removeprefix(b"data: "))
    assert event["error"]["code"] == "upstream_error"
    assert call.sent[-1].get("more_body", False) is False  # and then the stream closes
    assert (runtime.meter.records[0].status, runtime.meter.records[0].code) == (
        502,
        "upstream_error",
    )


async def test_a_mid_stream_failure_on_messages_is_an_anthropic_error_event(edge: Any) -> None:
    app, _, node = edge

    async def breaks(node: FakeNode, run: Any) -> None:
        await node.emit(run.run_id, "event: message_start\ndata: {}\n\n")
        await asyncio.sleep(0)
        await node.end(
            run.run_id, ok=False, error=wire.RunError(code="upstream_timeout", message="idle")
        )

    node.script = breaks
    body = {
        "model": "claude",
        "max_tokens": 5,
        "stream": True,
        "messages": [{"role": "user", "content": "x"}],
    }
    call = await api(app, "POST", "/v1/messages", body).done()
    assert call.body.endswith(b"\n\n")
    last = call.body.rstrip(b"\n").rpartition(b"\n\n")[2]
    assert last.startswith(b"event: error\ndata: ")
    assert json.loads(last.split(b"data: ", 1)[1]) == {
        "type": "error",
        "error": {"type": "api_error", "message": "idle"},
    }


async def test_a_failure_before_any_output_is_a_plain_http_error(edge: Any) -> None:
    app, _, node = edge

    async def fails(node: FakeNode, run: Any) -> None:
        await node.end(
            run.run_id,
            ok=False,
            error=wire.RunError(
                code="upstream_error", message="upstream returned HTTP 500", status=500
            ),
        )

    node.script = fails
    call = await api(app, "POST", "/v1/chat/completions", chat(stream=True)).done()
    assert call.status == 502
    assert call.json()["error"]["code"] == "upstream_error"


async def test_client_disconnect_mid_stream_cancels_the_run_and_frees_the_lease(edge: Any) -> None:
    app, runtime, node = edge

    async def endless(node: FakeNode, run: Any) -> None:
        await node.emit(run.run_id, "data: first\n\n")
        await node.release.wait()

    node.script = endless
    call = api(app, "POST", "/v1/chat/completions", chat(stream=True))
    await call.wait_for(lambda: b"first" in call.body)
    assert row(runtime, "p-open").in_flight == 1
    call.disconnect()
    await call.done()
    async with asyncio.timeout(WAIT):
        await node.cancel_seen.wait()
    assert node.cancelled == [node.runs[0].run_id]
    assert runtime.pool.idle()
    assert (runtime.meter.records[0].status, runtime.meter.records[0].code) == (
        499,
        "client_closed",
    )
    node.release.set()


async def test_client_disconnect_while_queued_leaves_the_queue_at_once(edge: Any) -> None:
    app, runtime, node = edge

    async def hold(node: FakeNode, run: Any) -> None:
        await node.release.wait()
        await node.end(run.run_id)

    node.script = hold
    first = api(app, "POST", "/v1/chat/completions", chat())
    async with asyncio.timeout(WAIT):
        await node.run_seen.wait()
    queued = api(app, "POST", "/v1/chat/completions", chat())
    await until(lambda: runtime.pool.snapshot().queue_depth == 1)
    queued.disconnect()
    await queued.done()
    assert runtime.pool.snapshot().queue_depth == 0
    assert len(node.runs) == 1  # the queued request never reached the Node
    node.release.set()
    await first.done()
    assert first.status == 200


async def test_an_idle_stream_gets_pings(edge: Any, monkeypatch: Any) -> None:
    app, _, node = edge
    monkeypatch.setattr(relay, "PING_INTERVAL_S", 0.02)

    async def quiet(node: FakeNode, run: Any) -> None:
        await node.release.wait()
        await node.emit(run.run_id, "data: late\n\n")
        await node.end(run.run_id)

    node.script = quiet
    call = api(app, "POST", "/v1/chat/completions", chat(stream=True))
    await call.wait_for(lambda: call.body.count(b": ping\n\n") >= 2)
    node.release.set()
    await call.done()
    assert call.status == 200 and call.body.endswith(b"data: late\n\n")


async def test_long_requests_take_a_long_slot_r_pool_7(edge: Any) -> None:
    app, runtime, node = edge
    seen: list[int] = []

    async def look(node: FakeNode, run: Any) -> None:
        seen.append(row(runtime, "p-open").long_in_flight)
        await node.end(run.run_id)

    node.script = look
    await api(app, "POST", "/v1/chat/completions", chat()).done()
    long_text = "x" * 1000  # > 200 tokens at 4 bytes each
    await api(
        app, "POST", "/v1/chat/completions", chat(messages=[{"role": "user", "content": long_text}])
    ).done()
    assert seen == [0, 1]


async def test_provider_auth_is_forwarded_to_openai_compatible_providers_only_r_auth_2() -> None:
    doc = document(provider_auth={"enabled": True, "required": False})
    runtime = Runtime(doc)
    node = await FakeNode(runtime.hub).start()
    app = OpenAIApp(runtime)
    headers = {"x-iop-provider-authorization": "sk-caller-key"}
    await api(app, "POST", "/v1/chat/completions", chat(), headers=headers).done()
    await api(app, "POST", "/v1/chat/completions", chat(model="local"), headers=headers).done()
    tunnel, normalized = node.runs
    assert tunnel.forward_headers == {"Authorization": "Bearer sk-caller-key"}
    assert isinstance(normalized, wire.RunRequest) and b"sk-caller-key" not in node.frames[-1]
    await runtime.hub.aclose()


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/v1/chat/completions", chat(model="nope"), 404, "model_not_found"),
        (
            "/v1/messages",
            {"model": "gpt", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
            400,
            "unsupported_operation",
        ),
        (
            "/v1/chat/completions",
            chat(model="local", tools=[{"type": "function"}]),
            400,
            "unsupported_operation",
        ),
        ("/v1/chat/completions", b"{oops", 400, "invalid_request"),
        ("/v1/chat/completions", chat(base_url="http://127.0.0.1:1/v1"), 400, "invalid_request"),
        (
            "/v1/chat/completions",
            chat(messages=[{"content": "x" * 5000}]),
            413,
            "request_too_large",
        ),
        ("/v1/embeddings", chat(), 404, "not_found"),
    ],
)
async def test_refusals_answer_from_the_error_table(
    edge: Any, path: str, body: Any, status: int, code: str
) -> None:
    app, runtime, node = edge
    call = await api(app, "POST", path, body).done()
    assert call.status == status
    if path.startswith("/v1/messages"):  # the Anthropic shape carries the type only
        assert call.json()["error"]["type"] == ERRORS[code].anthropic_type
    else:
        assert call.json()["error"]["code"] == code
    assert not node.runs
    assert runtime.meter.records[0].status == status


async def test_a_chunked_body_over_the_limit_is_413(edge: Any) -> None:
    app, _, node = edge
    call = await api(
        app,
        "POST",
        "/v1/chat/completions",
        chunks=[b'{"model":"gpt",' + b" " * 3000, b" " * 3000 + b"}"],
    ).done()
    assert call.status == 413 and call.json()["error"]["code"] == "request_too_large"
    assert not node.runs


async def test_queue_full_is_429_with_retry_after_and_queue_timeout_is_503() -> None:
    doc = document()
    doc["provider_pool"] = {"max_queue": 1, "queue_timeout_ms": 100}
    runtime = Runtime(doc)
    node = await FakeNode(runtime.hub).start()
    app = OpenAIApp(runtime)

    async def hold(node: FakeNode, run: Any) -> None:
        await node.release.wait()
        await node.end(run.run_id)

    node.script = hold
    running = api(app, "POST", "/v1/chat/completions", chat())
    async with asyncio.timeout(WAIT):
        await node.run_seen.wait()
    queued = api(app, "POST", "/v1/chat/completions", chat())
    await until(lambda: runtime.pool.snapshot().queue_depth == 1)
    full = await api(app, "POST", "/v1/chat/completions", chat()).done()
    assert full.status == 429 and full.headers[b"retry-after"] == b"1"
    assert full.json()["error"]["code"] == "queue_full"
    await queued.done()
    assert queued.status == 503 and queued.json()["error"]["code"] == "queue_timeout"
    node.release.set()
    await running.done()
    await runtime.hub.aclose()
    assert runtime.pool.idle()


async def test_no_live_provider_is_503_no_available_provider() -> None:
    runtime = Runtime(document())  # no Node connected
    call = await api(OpenAIApp(runtime), "POST", "/v1/chat/completions", chat()).done()
    assert call.status == 503 and call.json()["error"]["code"] == "no_available_provider"


async def test_auth_comes_first_and_is_401(edge: Any) -> None:
    app, runtime, node = edge
    for token in (None, "wrong"):
        call = await api(app, "POST", "/v1/chat/completions", chat(), token=token).done()
        assert call.status == 401 and call.json()["error"]["code"] == "invalid_api_key"
    call = await api(
        app, "POST", "/v1/messages", {}, token=None, headers={"x-api-key": "wrong"}
    ).done()
    assert call.status == 401 and call.json()["error"]["type"] == "authentication_error"
    assert not node.runs
    assert [r.token_ref for r in runtime.meter.records] == [None, None, None]


async def test_an_edge_bug_is_a_json_500_without_a_trace(edge: Any, caplog: Any) -> None:
    app, runtime, _ = edge

    async def broken(*args: Any) -> Any:
        raise RuntimeError("secret internals")

    runtime.hub.open_run = broken
    call = await api(app, "POST", "/v1/chat/completions", chat()).done()
    assert call.status == 500
    assert call.json()["error"]["code"] == "internal_error"
    assert b"secret internals" not in call.body and b"Traceback" not in call.body
    [record] = [r for r in caplog.records if r.exc_info]
    for formatter in (HumanFormatter(), JsonFormatter()):  # the Edge log's two forms
        line = formatter.format(record)
        assert "\n" not in line and "secret internals" not in line and "Traceback" not in line
        assert "RuntimeError (pool.http.attempt.open_attempt, line " in line


async def test_models_lists_the_catalog_groups_r_cfg_11(edge: Any) -> None:
    app, _, node = edge
    call = await api(app, "GET", "/v1/models").done()
    data = call.json()
    assert [m["id"] for m in data["data"]] == ["claude", "gpt", "local"]
    assert data["object"] == "list" and not node.runs
    one = await api(app, "GET", "/v1/models/gpt").done()
    assert one.json()["id"] == "gpt"
    missing = await api(app, "GET", "/v1/models/nope").done()
    assert missing.status == 404 and missing.json()["error"]["code"] == "model_not_found"
    wrong = await api(app, "POST", "/v1/models").done()
    assert wrong.status == 405
