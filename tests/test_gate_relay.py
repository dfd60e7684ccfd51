"""The gate on the Edge's relay path, in process with a scripted Node: a recovery that waits
in the queue for longer than the ping interval, a client leaving mid-recovery, and the
requests the gate leaves alone (R-SEG-5, R-SEG-6, R-POOL-9)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest

from nodes import wire
from pool.http import relay
from pool.http.app import OpenAIApp
from tests.support.inprocess import FakeNode, Runtime, api, chat, document, until

GATE = {"enabled": True, "filters": [{"type": "repeat_guard", "hold_evidence_runes": 40}]}


def chunk(content: str | None = None, finish: str | None = None, role: bool = False) -> str:
    delta: dict[str, Any] = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
    body = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "served",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    return "data: " + json.dumps(body) + "\n\n"


async def answer(node: FakeNode, run: Any, pieces: list[str]) -> None:
    await node.emit(run.run_id, chunk(role=True, content=""))
    for piece in pieces:
        await node.emit(run.run_id, chunk(piece))
    await node.emit(run.run_id, chunk(finish="stop") + "data: [DONE]\n\n")
    await node.end(run.run_id)


def body_of(run: Any) -> dict[str, Any]:
    return msgspec.json.decode(run.body)  # type: ignore[no-any-return]


@pytest.fixture
async def edge() -> Any:
    doc = document(stream_evidence_gate=GATE)
    doc["provider_pool"]["max_queue"] = 2
    runtime = Runtime(doc)
    node = await FakeNode(runtime.hub).start()
    yield OpenAIApp(runtime), runtime, node
    node.release.set()
    await runtime.hub.aclose()
    assert runtime.pool.idle(), "every lease released and no waiter left (R-POOL-9)"


def scripted(go: asyncio.Event) -> Any:
    """``hold`` waits for ``node.release``; a continuation answers; anything else loops once
    ``go`` is set, and does not end by itself."""

    async def script(node: FakeNode, run: Any) -> None:
        data = body_of(run)
        if data["messages"][0]["content"] == "hold":
            await node.release.wait()
            await answer(node, run, ["held answer"])
        elif "temperature" in data:
            await answer(node, run, ["and the rest."])
        else:
            await go.wait()
            for piece in ["Intro. "] + ["la "] * 40:
                await node.emit(run.run_id, chunk(piece))
            await node.release.wait()  # a loop goes on until it is cancelled

    return script


async def loop_behind_a_waiter(app: OpenAIApp, runtime: Runtime, node: FakeNode) -> Any:
    """A looping stream whose recovery must queue behind another request's waiter."""
    go = asyncio.Event()
    node.script = scripted(go)
    looping = api(app, "POST", "/v1/chat/completions", chat(stream=True))
    await node.run_seen.wait()
    holder = api(app, "POST", "/v1/chat/completions", chat_held())
    await until(lambda: runtime.pool.snapshot().queue_depth == 1)  # the holder waits
    go.set()
    await until(lambda: len(node.runs) == 2 and runtime.pool.snapshot().queue_depth == 1)
    return looping, holder


async def test_a_recovery_queued_past_the_ping_interval_resumes_and_completes_r_seg_6(
    edge, monkeypatch
):
    """R-SEG-6: the re-issue waits in the FIFO queue behind an earlier waiter; the relay's
    idle pings interrupt the wait without losing it, and the stream ends with the answer."""
    monkeypatch.setattr(relay, "PING_INTERVAL_S", 0.05)
    app, runtime, node = edge
    looping, holder = await loop_behind_a_waiter(app, runtime, node)
    assert body_of(node.runs[1])["messages"][0]["content"] == "hold"
    await looping.wait_for(lambda: b": ping" in b"".join(m.get("body", b"") for m in looping.sent))
    await looping.wait_for(lambda: b": ping\n\n: ping" in b"".join(
        m.get("body", b"") for m in looping.sent))  # fmt: skip
    assert len(node.runs) == 2  # still waiting: the pings did not re-issue it
    node.release.set()
    await looping.done()
    await holder.done()
    text = b"".join(m.get("body", b"") for m in looping.sent).decode()
    assert "la la la" not in text and "and the rest." in text
    assert len(node.runs) == 3  # the recovery was issued once, however many pings it waited
    assert node.cancelled == [node.runs[0].run_id]  # the looping run, cancelled at the fire
    assert runtime.gate.items() == [("p-open", "fired", 1), ("p-open", "recovered", 1)]


def chat_held() -> dict[str, Any]:
    body = chat(stream=True)
    body["messages"][0]["content"] = "hold"
    return body


async def test_a_client_leaving_while_the_recovery_waits_leaves_nothing_behind_r_pool_9(edge):
    """R-SEG-6, R-POOL-9: the queued re-issue is withdrawn and never sent to the Node."""
    app, runtime, node = edge
    looping, holder = await loop_behind_a_waiter(app, runtime, node)
    looping.disconnect()
    await looping.done()
    assert runtime.pool.snapshot().queue_depth == 0
    node.release.set()
    await holder.done()
    assert len(node.runs) == 2  # nothing re-issued
    assert node.cancelled == [node.runs[0].run_id]


@pytest.mark.parametrize(
    "extra", [{"n": 2}, {"stream": False}], ids=["several-choices", "not-streamed"]
)
async def test_requests_the_gate_does_not_cover_pass_unchanged_r_seg_5(edge, extra):
    """R-SEG-5: only streamed Chat Completions with one choice are gated."""
    app, runtime, node = edge

    async def loops(node: FakeNode, run: Any) -> None:
        if run.stream:
            await answer(node, run, ["la "] * 40)
        else:
            await node.emit(run.run_id, '{"choices": [{"message": {"content": "la la"}}]}')
            await node.end(run.run_id)

    node.script = loops
    call = await api(app, "POST", "/v1/chat/completions", {**chat(stream=True), **extra}).done()
    assert call.status == 200 and call.body.count(b"la ") == (40 if "n" in extra else 1)
    assert len(node.runs) == 1 and runtime.gate.items() == []


async def test_a_streamed_messages_request_is_not_gated_r_seg_5(edge):
    """R-SEG-5: the gate covers Chat Completions; an Anthropic client's stream passes as is."""
    app, runtime, node = edge
    event = 'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, '
    event += '"delta": {"type": "text_delta", "text": "la "}}\n\n'

    async def loops(node: FakeNode, run: Any) -> None:
        for _ in range(40):
            await node.emit(run.run_id, event)
        await node.end(run.run_id)

    node.script = loops
    body = {**chat(stream=True, model="claude"), "max_tokens": 64}
    call = await api(app, "POST", "/v1/messages", body).done()
    assert call.status == 200 and call.body.count(b'"text": "la "') == 40
    assert runtime.gate.items() == []


async def test_exhaustion_before_any_output_is_a_plain_502_repetition_detected_r_seg_6():
    """R-SEG-6: with no recovery allowed and nothing sent yet (no role chunk), the loop
    becomes the relay's plain error response, with code repetition_detected."""
    runtime = Runtime(document(stream_evidence_gate={**GATE, "request_fault_recovery": 0}))
    node = await FakeNode(runtime.hub).start()

    async def loops(node: FakeNode, run: Any) -> None:
        for _ in range(40):
            await node.emit(run.run_id, chunk("la "))
        await node.release.wait()

    node.script = loops
    call = await api(OpenAIApp(runtime), "POST", "/v1/chat/completions", chat(stream=True)).done()
    assert call.status == 502
    assert json.loads(call.body)["error"]["code"] == "repetition_detected"
    assert node.cancelled == [node.runs[0].run_id]
    assert runtime.gate.items() == [("p-open", "exhausted", 1), ("p-open", "fired", 1)]
    node.release.set()
    await runtime.hub.aclose()
    assert runtime.pool.idle()


async def test_a_run_failing_mid_stream_releases_the_held_text_before_the_error_r_seg_5(edge):
    """R-SEG-5: held text is output the client is owed; a run that fails after it gets the
    text first, then the relay's in-band error (never a silent truncation)."""
    app, runtime, node = edge

    async def fails(node: FakeNode, run: Any) -> None:
        await node.emit(run.run_id, chunk(role=True, content=""))
        await node.emit(run.run_id, chunk("A short and normal start"))
        error = wire.RunError(code="upstream_error", message="the upstream reported an error")
        await node.end(run.run_id, ok=False, error=error)

    node.script = fails
    call = await api(app, "POST", "/v1/chat/completions", chat(stream=True)).done()
    events = [e.removeprefix(b"data: ") for e in call.body.split(b"\n\n") if e]
    assert json.loads(events[-2])["choices"][0]["delta"]["content"] == "A short and normal start"
    assert json.loads(events[-1])["error"]["code"] == "upstream_error"
    assert runtime.gate.items() == []


async def test_text_the_gate_holds_does_not_hold_back_the_nodes_credit_r_in_5():
    """R-SEG-5, R-IN-5: a window of 20000 runes over a Node window of 65536 characters: the
    gate holds the text, not the Node, so a Node that waits for credit keeps sending and the
    client gets the whole answer."""
    gate = {"enabled": True, "filters": [{"type": "repeat_guard", "hold_evidence_runes": 20000}]}
    runtime = Runtime(document(stream_evidence_gate=gate, stream_buffer_bytes=65536))
    node = await FakeNode(runtime.hub).start()
    words = [f"w{i} " for i in range(2000)]  # ~11000 runes of content, ~300000 characters

    async def polite(node: FakeNode, run: Any) -> None:
        """A Node that sends only within its credit (R-IN-5)."""
        sent = 0

        def room() -> int:
            credited = sum(c.chars for c in node.credits if c.run_id == run.run_id)
            return run.credit + credited - sent

        for event in [chunk(role=True, content="")] + [chunk(w) for w in words]:
            await until(lambda event=event: room() >= len(event))
            await node.emit(run.run_id, event)
            sent += len(event)
        await node.emit(run.run_id, chunk(finish="stop") + "data: [DONE]\n\n")
        await node.end(run.run_id)

    node.script = polite
    call = await api(OpenAIApp(runtime), "POST", "/v1/chat/completions", chat(stream=True)).done()
    text = "".join(
        json.loads(e[6:])["choices"][0]["delta"].get("content") or ""
        for e in call.body.decode().split("\n\n")
        if e.startswith("data: {")
    )
    assert call.status == 200 and text == "".join(words)
    assert runtime.gate.items() == []
    await runtime.hub.aclose()
    assert runtime.pool.idle()
