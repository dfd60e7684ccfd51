"""The Edge's own backstops on a run, whatever its Node does: a Node that never ends a run
(a dropped terminal event) and a non-stream answer too large to buffer (R-POOL-9)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pool.http import operations, relay
from pool.http.app import OpenAIApp
from tests.support.inprocess import FakeNode, Runtime, api, chat, document


@pytest.fixture
async def edge(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(operations, "NODE_SILENCE_GRACE_S", 0.0)
    doc = document()
    gpt = doc["nodes"][0]["providers"][0]
    gpt.update(first_byte_timeout_ms=200, idle_timeout_ms=200)
    runtime = Runtime(doc)
    node = await FakeNode(runtime.hub).start()
    yield OpenAIApp(runtime), runtime, node
    await runtime.hub.aclose()
    assert runtime.pool.idle(), "every lease released and no waiter left (R-POOL-9)"


async def never_ends(node: FakeNode, run: Any) -> None:
    await node.release.wait()


async def test_a_node_that_never_answers_ends_as_upstream_timeout_and_is_cancelled(edge):
    app, _, node = edge
    node.script = never_ends
    call = await api(app, "POST", "/v1/chat/completions", chat()).done()
    assert call.status == 504
    assert json.loads(call.body)["error"]["code"] == "upstream_timeout"
    assert node.cancelled == [node.runs[0].run_id]
    node.release.set()


async def test_a_stream_whose_node_goes_silent_ends_with_an_in_band_timeout(edge):
    app, _, node = edge

    async def then_silent(node: FakeNode, run: Any) -> None:
        await node.emit(run.run_id, "data: one\n\n")
        await node.release.wait()

    node.script = then_silent
    call = await api(app, "POST", "/v1/chat/completions", chat(stream=True)).done()
    assert call.status == 200 and call.body.startswith(b"data: one\n\n")
    last = call.body.rstrip(b"\n").rpartition(b"\n\n")[2]
    assert json.loads(last.removeprefix(b"data: "))["error"]["code"] == "upstream_timeout"
    assert node.cancelled == [node.runs[0].run_id]
    node.release.set()


async def test_a_non_stream_answer_too_large_to_buffer_is_refused(edge, monkeypatch):
    app, _, node = edge
    monkeypatch.setattr(relay, "MAX_WHOLE_BODY_CHARS", 10)

    async def huge(node: FakeNode, run: Any) -> None:
        await node.emit(run.run_id, "x" * 8)
        await node.emit(run.run_id, "x" * 8)
        await node.release.wait()

    node.script = huge
    call = await api(app, "POST", "/v1/chat/completions", chat()).done()
    assert call.status == 502
    assert json.loads(call.body)["error"]["code"] == "upstream_error"
    assert node.cancelled == [node.runs[0].run_id]
    node.release.set()


def test_the_silence_limit_is_the_nodes_own_limit_plus_a_grace():
    from catalog.config import load_snapshot

    snapshot = load_snapshot(document())
    limit = operations.silence_limit(snapshot.providers["p-open"])
    spec = snapshot.providers["p-open"]
    longest = max(spec.first_byte_timeout_ms, spec.idle_timeout_ms) / 1000
    assert limit == longest + operations.NODE_SILENCE_GRACE_S


async def test_a_draining_edge_admits_no_new_request(edge):
    app, runtime, node = edge
    runtime.draining = True
    call = await api(app, "POST", "/v1/chat/completions", chat()).done()
    assert call.status == 503
    assert json.loads(call.body)["error"]["code"] == "no_available_provider"
    assert node.runs == []
