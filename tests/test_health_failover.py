"""Retry before the first byte and passive ejection through the HTTP surface, in process
(a real pool and NodeHub, a scripted Node, a daphne-like driver): R-HEALTH-1, R-HEALTH-2."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

from nodes import wire
from pool.http.app import OpenAIApp
from tests.support.inprocess import Call, FakeNode, Runtime, answer_ok, started, stop, until

TOKEN = "tok-health-caller-51c2"
CONNECT_REFUSED = wire.RunError(
    code="upstream_error",
    message="cannot connect to 127.0.0.1:9",
    retryable=True,
    phase=wire.PHASE_CONNECT,
)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def document(pool: dict[str, Any] | None = None, providers: tuple[str, ...] = ("p-dead", "p-live")):
    entries = [
        {
            "id": pid,
            "profile": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "capacity": 2,
            "priority": 10 + i,  # p-dead is preferred, so every fresh request tries it first
        }
        for i, pid in enumerate(providers)
    ]
    return {
        "edge": {"id": "e", "listen": "127.0.0.1:17100"},
        "admin": {"listen": "127.0.0.1:17101"},
        "provider_pool": {"max_queue": 4, "queue_timeout_ms": 30000, **(pool or {})},
        "openai": {
            "listen": "127.0.0.1:17102",
            "principal_tokens": [
                {"token_ref": "app-h", "token_hash_sha256": sha(TOKEN), "principal_ref": "team-h"}
            ],
        },
        "nodes": [{"id": "n1", "token_hash_sha256": sha("node"), "providers": entries}],
        "models": [{"id": "gpt", "providers": {pid: "served" for pid in providers}}],
    }


def failing(error: wire.RunError, *, after: str | None = None) -> Any:
    """A script: p-dead fails with ``error`` (after emitting ``after``), the rest answer ok."""

    async def script(node: FakeNode, run: Any) -> None:
        if run.provider_id != "p-dead":
            await answer_ok(node, run)
            return
        if after is not None:
            await node.emit(run.run_id, after)
        await node.end(run.run_id, ok=False, error=error)

    return script


def chat(stream: bool) -> dict[str, Any]:
    return {"model": "gpt", "messages": [{"role": "user", "content": "hi"}], "stream": stream}


async def post(app: OpenAIApp, stream: bool = False) -> Call:
    return await Call(app, "POST", "/v1/chat/completions", chat(stream), token=TOKEN).done()


def health(runtime: Runtime, provider_id: str) -> Any:
    (row,) = [p for p in runtime.pool.snapshot().providers if p.provider_id == provider_id]
    return row


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(
    "error",
    [
        CONNECT_REFUSED,
        wire.RunError(
            code="upstream_error",
            message="upstream returned HTTP 503",
            retryable=True,
            status=503,
            phase=wire.PHASE_BEFORE_FIRST_BYTE,
        ),
        wire.RunError(
            code="upstream_timeout",
            message="no response from upstream within 60s (first byte)",
            retryable=True,
            phase=wire.PHASE_BEFORE_FIRST_BYTE,
        ),
    ],
    ids=["refused", "http-503", "first-byte-timeout"],
)
async def test_a_failure_before_the_first_byte_is_answered_once_by_another_provider_r_health_1(
    stream: bool, error: wire.RunError
) -> None:
    """R-HEALTH-1: the failed attempt's lease goes back, the next one excludes p-dead."""
    app, runtime, node = await started(document())
    node.script = failing(error)
    call = await post(app, stream)
    assert call.status == 200
    assert [run.provider_id for run in node.runs] == ["p-dead", "p-live"]
    expected = b"data: one\n\ndata: two\n\n" if stream else b'{"ok":true}'
    assert call.body == expected  # the answer once, nothing of the failed attempt
    (record,) = runtime.meter.records
    assert (record.status, record.provider_id) == (200, "p-live")
    assert runtime.health.retries == {("gpt", "p-dead"): 1}
    await stop(runtime)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_failure_after_the_first_byte_is_never_retried_r_health_1(stream: bool) -> None:
    """R-HEALTH-1: output reached the Edge, so the Node reports it after the first byte."""
    app, runtime, node = await started(document())
    late = wire.RunError(
        code="upstream_error",
        message="upstream closed the connection mid-response",
        phase=wire.PHASE_AFTER_FIRST_BYTE,
    )
    node.script = failing(late, after="data: partial\n\n" if stream else '{"partial":')
    call = await post(app, stream)
    assert [run.provider_id for run in node.runs] == ["p-dead"]
    if stream:
        assert call.status == 200
        assert call.body.startswith(b"data: partial\n\n") and b"upstream_error" in call.body
        assert call.body.count(b"data: partial") == 1
    else:
        assert call.status == 502
    assert health(runtime, "p-dead").consecutive_failures == 0  # not a health signal
    assert runtime.health.retries == {}
    await stop(runtime)


async def test_zero_retries_before_the_first_byte_answers_the_first_failure_r_health_1() -> None:
    """R-HEALTH-1: ``retry_before_first_byte: 0`` turns failover off."""
    app, runtime, node = await started(document({"retry_before_first_byte": 0}))
    node.script = failing(CONNECT_REFUSED)
    call = await post(app)
    assert call.status == 502 and call.json()["error"]["code"] == "upstream_error"
    assert [run.provider_id for run in node.runs] == ["p-dead"]
    await stop(runtime)


async def test_a_request_that_never_reached_an_upstream_is_metered_with_zero_tokens() -> None:
    """A refused connection is an error of that provider with no token estimate."""
    app, runtime, node = await started(document(providers=("p-dead",)))
    node.script = failing(CONNECT_REFUSED)
    call = await post(app)
    assert call.status == 502
    (record,) = runtime.meter.records
    assert (record.status, record.provider_id) == (502, "p-dead")
    assert (record.input_tokens, record.output_tokens, record.estimated) == (0, 0, False)
    await stop(runtime)


async def test_failures_in_a_row_eject_and_the_next_request_skips_the_provider_r_health_2() -> None:
    """R-HEALTH-2: ``eject_after_failures`` failures eject; selection skips the row at once."""
    app, runtime, node = await started(document({"eject_after_failures": 2}))
    node.script = failing(CONNECT_REFUSED)
    for _ in range(2):
        assert (await post(app)).status == 200
    row = health(runtime, "p-dead")
    assert row.health == "ejected"
    assert row.health_reason == "cannot connect to the upstream (2 failures in a row)"
    assert 0 < row.ejected_for_s <= 10
    runs = len(node.runs)
    assert (await post(app)).status == 200
    assert [run.provider_id for run in node.runs[runs:]] == ["p-live"]  # no attempt on p-dead
    assert runtime.pool.ejections_total == {"p-dead": 1}
    await stop(runtime)


async def test_a_group_with_every_provider_ejected_is_503_at_once_naming_the_reason() -> None:
    """R-HEALTH-2: nothing queues for a group that cannot run; the message has no address."""
    app, runtime, node = await started(document({"eject_after_failures": 1}, ("p-dead",)))
    node.script = failing(CONNECT_REFUSED)
    first = await post(app)
    assert first.status == 502
    second = await post(app, stream=True)
    assert second.status == 503
    error = second.json()["error"]
    assert error["code"] == "no_available_provider"
    assert "ejected" in error["message"] and "cannot connect to the upstream" in error["message"]
    assert "127.0.0.1" not in error["message"]
    assert len(node.runs) == 1 and runtime.pool.snapshot().queue_depth == 0
    await stop(runtime)


async def test_an_upstream_429_with_retry_after_ejects_for_that_long_r_health_2() -> None:
    """R-HEALTH-2: Retry-After sets the ejection, whatever ``eject_after_failures`` says."""
    app, runtime, node = await started(document({"eject_after_failures": 3, "eject_max_s": 120}))
    limited = wire.RunError(
        code="upstream_error",
        message="upstream returned HTTP 429",
        retryable=True,
        status=429,
        phase=wire.PHASE_BEFORE_FIRST_BYTE,
        retry_after_s=90.0,
    )
    node.script = failing(limited)
    assert (await post(app)).status == 200
    row = health(runtime, "p-dead")
    assert row.health == "ejected" and row.health_reason.startswith("rate limited")
    assert 80 < row.ejected_for_s <= 90
    await stop(runtime)


async def test_a_4xx_from_the_upstream_is_not_retried_and_counts_as_an_answer() -> None:
    """R-HEALTH-1: only transient failures go elsewhere; a 400 is the caller's answer."""
    app, runtime, node = await started(document())

    async def one_failure_then_400(node: FakeNode, run: Any) -> None:
        if len(node.runs) == 1:
            await node.end(run.run_id, ok=False, error=CONNECT_REFUSED)
            return
        bad = wire.RunError(
            code="upstream_error",
            message="upstream returned HTTP 400",
            status=400,
            phase=wire.PHASE_BEFORE_FIRST_BYTE,
        )
        await node.end(run.run_id, ok=False, error=bad)

    node.script = one_failure_then_400
    assert (await post(app)).status == 502  # p-dead refused, p-live said 400: no third try
    assert [run.provider_id for run in node.runs] == ["p-dead", "p-live"]
    assert health(runtime, "p-dead").consecutive_failures == 1
    assert health(runtime, "p-live").consecutive_failures == 0
    await stop(runtime)


async def with_p_live_held(pool: dict[str, Any] | None = None) -> Any:
    """p-live has one slot, held by a first request (which failed over from p-dead) until
    the returned event is set; p-dead refuses every connection."""
    doc = document(pool)
    doc["nodes"][0]["providers"][1]["capacity"] = 1
    app, runtime, node = await started(doc)
    hold = asyncio.Event()

    async def script(node: FakeNode, run: Any) -> None:
        if run.provider_id == "p-dead":
            await node.end(run.run_id, ok=False, error=CONNECT_REFUSED)
            return
        await hold.wait()
        await answer_ok(node, run)

    node.script = script
    busy = Call(app, "POST", "/v1/chat/completions", chat(False), token=TOKEN)
    await until(lambda: [run.provider_id for run in node.runs] == ["p-dead", "p-live"])
    return app, runtime, node, hold, busy


async def test_a_retry_waits_in_the_queue_and_runs_when_a_slot_frees_r_health_1() -> None:
    """R-HEALTH-1: the retry re-enters admission like any request: it queues for p-live."""
    app, runtime, node, hold, busy = await with_p_live_held()
    retried = Call(app, "POST", "/v1/chat/completions", chat(True), token=TOKEN)
    await until(lambda: len(node.runs) == 3 and runtime.pool.snapshot().queue_depth == 1)
    hold.set()
    assert (await busy.done()).status == 200
    assert (await retried.done()).status == 200
    assert [run.provider_id for run in node.runs] == ["p-dead", "p-live", "p-dead", "p-live"]
    await stop(runtime)


async def test_a_retry_that_cannot_start_within_the_queue_deadline_answers_the_failure() -> None:
    """R-HEALTH-1: the original deadline bounds the retry; the caller gets the upstream's
    failure, not a queue timeout, and the queue is left empty."""
    app, runtime, _, hold, busy = await with_p_live_held({"queue_timeout_ms": 300})
    late = await post(app)
    assert late.status == 502 and late.json()["error"]["code"] == "upstream_error"
    assert runtime.pool.snapshot().queue_depth == 0
    hold.set()
    assert (await busy.done()).status == 200
    await stop(runtime)


async def test_a_caller_leaving_after_output_started_counts_as_an_answer_r_health_2() -> None:
    """R-HEALTH-2: output reached the caller, so the upstream works even if the caller then
    left (a streaming SDK often closes right after ``[DONE]``): the failure count restarts."""
    app, runtime, node = await started(document())
    streaming = asyncio.Event()

    async def script(node: FakeNode, run: Any) -> None:
        if run.provider_id == "p-dead" and len(node.runs) == 1:
            await node.end(run.run_id, ok=False, error=CONNECT_REFUSED)
        elif run.provider_id == "p-dead":
            await node.emit(run.run_id, "data: one\n\n")
            streaming.set()
            await asyncio.Event().wait()  # until the Edge cancels the run
        else:
            await answer_ok(node, run)

    node.script = script
    assert (await post(app)).status == 200
    assert health(runtime, "p-dead").consecutive_failures == 1
    call = Call(app, "POST", "/v1/chat/completions", chat(True), token=TOKEN)
    await streaming.wait()
    await call.wait_for(lambda: len(call.bodies) >= 1)
    call.disconnect()
    await call.done()
    await until(lambda: runtime.pool.idle())
    assert health(runtime, "p-dead").consecutive_failures == 0
    await stop(runtime)
