"""The Stream Evidence Gate through a real Edge (daphne), a real ``iop-node`` and fake
upstreams that loop on demand: the loop never reaches the client, recovery by each strategy,
exhaustion, a client leaving during recovery, and every lease back (R-POOL-9).

R-SEG-5, R-SEG-6, R-SEG-8.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support import Stack
from tests.support.payloads import chat_body

pytestmark = pytest.mark.slow

HOLD = 256  # units up to 64 runes; a loop fires once its copies cover 128 runes
SENTENCE = "The quick brown fox jumps over the lazy dog near the river. "  # 60 runes
SNAPSHOT_BYTES = 4096
GATE = {
    "enabled": True,
    "request_fault_recovery": 2,
    "strategy_caps": {"resample": 1, "switch_provider": 1},
    "ingress_snapshot_bytes": SNAPSHOT_BYTES,
    "filters": [{"type": "repeat_guard", "hold_evidence_runes": HOLD}],
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    providers = [
        {"id": "p-a", "profile": "openai", "base_url": "{up:a}/v1", "capacity": 2, "priority": 1},
        {"id": "p-b", "profile": "openai", "base_url": "{up:b}/v1", "capacity": 1, "priority": 9},
        {
            "id": "p-claude",
            "profile": "anthropic",
            "base_url": "{up:claude}/v1",
            "capacity": 1,
            "credential": {"env": "IOP_TEST_GATE_KEY"},
        },
    ]
    models = [
        {"id": "solo", "providers": {"p-a": "served-a"}},
        {"id": "pair", "providers": {"p-a": "served-a", "p-b": "served-b"}},
        {"id": "b-only", "providers": {"p-b": "served-b"}},
        {"id": "chat-over-claude", "providers": {"p-claude": "claude-served"}, "translate": True},
    ]
    with Stack(
        tmp_path_factory.mktemp("gate"),
        upstreams={"a": "openai", "b": "openai", "claude": "anthropic"},
        providers=providers,
        models=models,
        openai={"stream_evidence_gate": GATE},
        env={"IOP_TEST_GATE_KEY": "sk-test-gate-provider"},
    ) as running:
        yield running


@pytest.fixture(autouse=True)
def idle_after(stack: Stack) -> Iterator[None]:
    with stack.clean_slate():
        yield


def loop(stack: Stack, upstream: str, unit: str, *, times: int | None = None, **kw: Any) -> None:
    faults = stack.upstream(upstream).server.faults
    for name, value in {"loop_unit": unit, "loop_requests": times, **kw}.items():
        setattr(faults, name, value)


def stream_text(
    client: openai.OpenAI, model: str, models: set[str] | None = None
) -> tuple[str, set[str]]:
    """The streamed answer's content and the set of chunk ids the client saw (and, into
    ``models``, the model names)."""
    text, ids = [], set()
    for chunk in client.chat.completions.create(**chat_body("Tell me", model=model), stream=True):
        ids.add(chunk.id)
        if models is not None:
            models.add(chunk.model)
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
    return "".join(text), ids


def gate_counts(stack: Stack) -> dict[tuple[str, str], float]:
    return {
        (s.labels["provider"], s.labels["outcome"]): s.value
        for s in stack.metrics()
        if s.name == "iop_gate_events_total"
    }


def delta(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def counted(stack: Stack, before: dict[tuple[str, str], float], expected: dict) -> dict:
    """The counts added since ``before``, once they equal ``expected`` or after 5 s (the
    client may read ``[DONE]`` before the Edge has seen the run end)."""
    deadline = time.monotonic() + 5
    while True:
        found = delta(before, gate_counts(stack))
        if found == expected or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def bodies(stack: Stack, upstream: str) -> list[dict[str, Any]]:
    return [r.json for r in stack.upstream(upstream).server.requests]


def test_a_loop_is_resampled_and_the_client_never_sees_it_r_seg_6(stack, oai):
    """R-SEG-6: a one-character loop after a normal prefix fires; the run is re-issued on the
    same provider with the next temperature and the delivered text as the assistant's partial
    answer; the client gets one stream, one id, no loop."""
    prefix = " ".join(f"step {i} of the plan;" for i in range(30)) + " "  # ~570 runes
    loop(stack, "a", "!", times=1, loop_prefix=prefix, loop_copies=400)
    before = gate_counts(stack)
    text, ids = stream_text(oai, "solo")
    assert "!!!!" not in text and len(ids) == 1
    assert text.endswith(stack.upstream("a").server.reply_text)
    first, second = bodies(stack, "a")
    assert "temperature" not in first and second["temperature"] == 1.0
    partial = second["messages"][-1]
    assert partial["role"] == "assistant" and text.startswith(partial["content"])
    assert partial["content"] and prefix.startswith(partial["content"])
    assert second["messages"][:-1] == first["messages"]
    expected = {("p-a", "fired"): 1, ("p-a", "recovered"): 1}
    assert counted(stack, before, expected) == expected


@pytest.mark.parametrize(
    "unit",
    [SENTENCE, "👩‍👩‍👧‍👦", "반복되는 말 ", "0, "],
    ids=["long-sentence", "emoji-zwj", "korean", "short-unit"],
)
def test_loops_of_every_shape_never_reach_the_client_r_seg_5(stack, oai, unit):
    """R-SEG-5: loops of a long sentence, of multi-code-point graphemes and of Korean text,
    split across events (7-rune pieces), are held back and recovered."""
    loop(stack, "a", unit, times=1, loop_copies=HOLD)
    text, _ = stream_text(oai, "solo")
    assert unit * 3 not in text
    assert text == stack.upstream("a").server.reply_text
    assert len(stack.upstream("a").server.requests) == 2


def test_a_provider_that_loops_again_is_switched_away_from_r_seg_6(stack, oai):
    """R-SEG-6: the resample loops again; the next recovery goes to another provider of the
    group (switch_provider), which answers."""
    loop(stack, "a", "la ", loop_copies=200)
    before = gate_counts(stack)
    models = set()
    text, ids = stream_text(oai, "pair", models)
    assert text == stack.upstream("b").server.reply_text and len(ids) == 1
    assert models == {"pair"}  # the client's model, whichever provider answered
    assert len(bodies(stack, "a")) == 2 and len(bodies(stack, "b")) == 1
    switched = bodies(stack, "b")[0]
    assert switched["model"] == "served-b" and "temperature" not in switched
    expected = {
        ("p-a", "fired"): 2,
        ("p-b", "recovered"): 1,
    }
    assert counted(stack, before, expected) == expected


def test_exhausted_recovery_ends_the_stream_with_repetition_detected_r_seg_6(stack, oai):
    """R-SEG-6: every provider loops; after request_fault_recovery attempts the stream ends
    with the in-band error ``repetition_detected`` and no loop text."""
    loop(stack, "a", "ha", loop_copies=300)
    loop(stack, "b", "ha", loop_copies=300)
    before = gate_counts(stack)
    seen: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in oai.chat.completions.create(**chat_body("Tell me", model="pair"), stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                seen.append(chunk.choices[0].delta.content)
    assert "hahaha" not in "".join(seen)
    assert "repeating" in str(caught.value)
    assert len(bodies(stack, "a")) == 2 and len(bodies(stack, "b")) == 1
    expected = {
        ("p-a", "fired"): 2,
        ("p-b", "fired"): 1,
        ("p-b", "exhausted"): 1,
    }
    assert counted(stack, before, expected) == expected
    assert "fired on provider p-b" in stack.logs()


def test_the_in_band_error_has_the_openai_stream_error_shape_r_seg_6(stack):
    """R-SEG-6: the last event is an OpenAI error object with code repetition_detected."""
    loop(stack, "a", "x", loop_copies=500)
    headers = {"authorization": f"Bearer {stack.token}"}
    body = chat_body("Tell me", model="solo", stream=True)
    with httpx.stream(
        "POST", stack.v1_url + "/chat/completions", json=body, headers=headers, timeout=30
    ) as resp:
        assert resp.status_code == 200
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    error = json.loads(events[-1])["error"]
    assert error["code"] == "repetition_detected" and error["type"] == "server_error"
    assert all("xxxx" not in e for e in events)


def test_a_request_larger_than_the_snapshot_runs_with_the_gate_off_r_seg_6(stack, oai):
    """R-SEG-6: a body over ingress_snapshot_bytes is not gated, and the log says so."""
    loop(stack, "a", "z", loop_copies=300)
    big = "padding " * (SNAPSHOT_BYTES // 8 + 10)
    text = "".join(
        c.choices[0].delta.content or ""
        for c in oai.chat.completions.create(**chat_body(big, model="solo"), stream=True)
        if c.choices
    )
    assert text == "z" * 300
    assert "stream evidence gate off for run" in stack.logs()


def test_a_client_leaving_during_recovery_releases_everything_r_pool_9(stack):
    """R-SEG-6, R-POOL-9: the recovery waits in the queue for a busy provider; the client
    leaves; the waiter and every lease are gone and nothing is re-issued."""
    held = asyncio.Event()
    stack.upstream("b").server.faults.hold_mid_stream = held
    headers = {"authorization": f"Bearer {stack.token}"}
    url = stack.v1_url + "/chat/completions"
    holder_done = threading.Event()

    def hold_b() -> None:
        body = chat_body("hold", model="b-only", stream=True)
        with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as resp:
            for _ in resp.iter_lines():
                pass
        holder_done.set()

    holder = threading.Thread(target=hold_b, daemon=True)
    holder.start()
    stack.wait_until(lambda s: stack.provider("p-b")["in_flight"] == 1, what="p-b busy")
    loop(stack, "a", "ab", loop_copies=300)
    body = chat_body("Tell me", model="pair", stream=True)
    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as resp:
        assert resp.status_code == 200
        stack.wait_until(lambda s: s["queue_depth"] == 1, what="the recovery queued")
    stack.wait_until(lambda s: s["queue_depth"] == 0, what="the waiter gone")
    assert len(bodies(stack, "b")) == 1  # only the holder: nothing was re-issued
    stack.upstream("b").call(_set(held))
    assert holder_done.wait(10)
    holder.join(10)


async def _set(event: asyncio.Event) -> None:
    event.set()


def test_the_status_page_data_and_metrics_show_gate_counts_r_seg_6(stack, oai):
    """R-SEG-6: /pool carries the per-provider gate counts that /metrics exports."""
    loop(stack, "a", "?", times=1, loop_copies=400)
    stream_text(oai, "solo")
    counts = stack.pool_snapshot()["gate"]
    assert counts["p-a"]["fired"] >= 1 and counts["p-a"]["recovered"] >= 1
    assert gate_counts(stack)[("p-a", "fired")] == counts["p-a"]["fired"]


def test_a_chat_stream_translated_from_messages_is_gated_and_recovered_r_seg_5(stack, oai):
    """R-SEG-5, R-SEG-6: a Chat client served by an Anthropic Messages provider: the loop in
    the translated stream fires; the resample goes out as Messages with the partial answer."""
    loop(stack, "claude", "ping pong ", times=1, loop_copies=100)
    text, ids = stream_text(oai, "chat-over-claude")
    assert text == stack.upstream("claude").server.reply_text and len(ids) == 1
    first, second = bodies(stack, "claude")
    assert second["temperature"] == 1.0 and "temperature" not in first
    assert len(second["messages"]) == len(first["messages"])  # nothing delivered: no partial


def test_a_discarded_attempt_is_metered_as_estimated_tokens_r_bud_2(stack, oai):
    """R-BUD-2: the run the gate discarded produced tokens: they reach /metrics and the ledger
    as estimated tokens on its provider (no extra request), beside the answer's own usage."""

    def estimated_out() -> float:
        return sum(
            s.value
            for s in stack.metrics()
            if s.name == "iop_tokens_total"
            and s.labels["estimated"] == "true"
            and s.labels["direction"] == "out"
            and s.labels["attributed_to"] == "p-a"
        )

    def requests() -> float:
        return sum(
            s.value
            for s in stack.metrics()
            if s.name == "iop_requests_total" and s.labels["model_group"] == "solo"
        )

    before, requests_before = estimated_out(), requests()
    loop(stack, "a", "?", times=1, loop_copies=400)
    stream_text(oai, "solo")
    deadline = time.monotonic() + 5
    while estimated_out() == before:  # the meter records once the Edge saw the run end
        assert time.monotonic() < deadline, "no estimated tokens for the discarded attempt"
        time.sleep(0.02)
    # the gate holds up to HOLD runes of evidence before it fires: at least 128 runes came
    assert estimated_out() - before >= 128 // 4
    assert requests() - requests_before == 1  # tokens only: the request is counted once
    deadline = time.monotonic() + 15  # the meter writes the ledger every few seconds
    while True:
        in_ledger = sum(
            r["output_tokens"]
            for r in stack.ledger()
            if r["attributed_to"] == "p-a" and r["estimated"]
        )
        if in_ledger == estimated_out() or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert in_ledger == estimated_out()
