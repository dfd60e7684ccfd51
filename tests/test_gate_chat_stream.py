"""The gate on a streamed Chat Completion: one stream, one id, no loop.

R-SEG-5, R-SEG-6, R-SEG-8.
"""

from __future__ import annotations

import json
import random

from pool.gate import FilterPipeline, FilterSpec
from pool.gate.chat_stream import GatedChat


def sse(chunk_id: str, pieces: list[str], *, tool: bool = False) -> str:
    """An OpenAI chat stream as an upstream sends it (role, content, finish, usage, DONE)."""

    def event(choices, **extra):
        body = {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": 111,
            "model": "served",
        }
        return "data: " + json.dumps({**body, "choices": choices, **extra}) + "\n\n"

    out = [event([{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}])]
    out += [event([{"index": 0, "delta": {"content": p}, "finish_reason": None}]) for p in pieces]
    if tool:
        call = {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": "f", "arguments": "{}"},
        }
        out.append(event([{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]))
    out.append(event([{"index": 0, "delta": {}, "finish_reason": "stop"}]))
    out.append(event([], usage={"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}))
    out.append("data: [DONE]\n\n")
    return "".join(out)


def split_randomly(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    parts, i = [], 0
    while i < len(text):
        step = rng.randint(1, 40)
        parts.append(text[i : i + step])
        i += step
    return parts


def events(text: str) -> list[dict | str]:
    found: list[dict | str] = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            found.append(data if data == "[DONE]" else json.loads(data))
    return found


def content_of(parsed: list[dict | str]) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content") or ""
        for e in parsed
        if isinstance(e, dict) and e["choices"]
    )


def gate(hold: int = 40, observe: bool = False) -> GatedChat:
    return GatedChat(FilterPipeline([FilterSpec("repeat_guard", hold, observe)]), model="asked")


def run(g: GatedChat, text: str, seed: int = 0) -> str:
    return "".join(g.feed(part) for part in split_randomly(text, seed)) + g.end()


def test_normal_text_passes_whole_with_the_events_in_order() -> None:
    pieces = ["The pool ", "leases capacity ", "across aliases; ", "one queue serves all."] * 3
    for seed in range(5):
        out = events(run(gate(), sse("chatcmpl-a", pieces, tool=True), seed))
        assert content_of(out) == "".join(pieces)
        assert out[-1] == "[DONE]"
        assert out[-2]["usage"]["completion_tokens"] == 9
        assert out[-3]["choices"][0]["finish_reason"] == "stop"
        assert out[0]["choices"][0]["delta"] == {"role": "assistant"}
        finish_at = next(
            i
            for i, e in enumerate(out)
            if isinstance(e, dict) and e["choices"] and e["choices"][0].get("finish_reason")
        )
        assert all(
            not (isinstance(e, dict) and e["choices"] and e["choices"][0]["delta"].get("content"))
            for e in out[finish_at:]
        )


def test_every_chunk_carries_the_first_id_and_the_model_the_client_asked_for() -> None:
    out = events(run(gate(), sse("chatcmpl-a", ["hello there, how are you today?"] * 2)))
    ids = {e["id"] for e in out if isinstance(e, dict)}
    assert ids == {"chatcmpl-a"}
    assert {e["model"] for e in out if isinstance(e, dict)} == {"asked"}


def test_a_loop_fires_and_nothing_of_it_reaches_the_client() -> None:
    """R-SEG-5: the repeated unit is held and discarded; what was released is kept."""
    g = gate(hold=40)
    out = "".join(
        g.feed(p) for p in split_randomly(sse("chatcmpl-a", ["Intro text. "] + ["la "] * 60), 3)
    )
    assert g.fired is not None and g.fired.fired == "repeat_guard"
    assert g.end() == ""
    sent = content_of(events(out))
    assert "la la la" not in sent
    assert sent == g.delivered_text
    assert "[DONE]" not in out


def test_after_a_recovery_the_client_sees_one_stream_with_one_id() -> None:
    """R-SEG-6: the second attempt's chunks leave with the first attempt's id."""
    g = gate(hold=40)
    first = "".join(
        g.feed(p)
        for p in split_randomly(sse("chatcmpl-a", ["Intro text here. "] + ["la "] * 60), 1)
    )
    assert g.fired is not None
    g.restart(FilterPipeline([FilterSpec("repeat_guard", 40)]))
    second = run(g, sse("chatcmpl-b", ["and the answer ", "continues normally."]), 2)
    out = events(first + second)
    assert {e["id"] for e in out if isinstance(e, dict)} == {"chatcmpl-a"}
    assert content_of(out) == g.delivered_text
    assert content_of(out).endswith("and the answer continues normally.")
    assert out[-1] == "[DONE]"


def test_observe_mode_changes_nothing_and_reports_once() -> None:
    """R-SEG-8: observe releases every piece as it comes and keeps the evidence."""
    g = gate(hold=40, observe=True)
    pieces = ["Intro. "] + ["la "] * 60
    out = events(run(g, sse("chatcmpl-a", pieces)))
    assert content_of(out) == "".join(pieces)
    assert g.fired is None and g.observed is not None


def test_a_tool_call_follows_the_text_held_before_it() -> None:
    """R-SEG-5: a tool call flushes the held text first, so the client sees the upstream's
    order (text, then the call) and is not kept waiting for the window."""
    g = gate(hold=400)
    blocks = sse("chatcmpl-a", ["short"], tool=True).split("\n\n")
    before_call = "\n\n".join(blocks[:2]) + "\n\n"  # role, content
    assert content_of(events(g.feed(before_call))) == ""  # inside the 400-rune window
    released = events(g.feed(blocks[2] + "\n\n"))  # the tool call
    assert content_of(released) == "short"
    assert released[-1]["choices"][0]["delta"].get("tool_calls")
    assert g.fired is None


def test_after_a_recovery_the_role_is_not_sent_again() -> None:
    """R-SEG-6: one stream: the role delta of the second attempt is dropped."""
    g = gate(hold=40)
    first = "".join(g.feed(p) for p in split_randomly(sse("a", ["Intro. "] + ["la "] * 60), 4))
    assert g.fired is not None
    g.restart(FilterPipeline([FilterSpec("repeat_guard", 40)]))
    out = events(first + run(g, sse("b", ["and then it goes on normally."]), 5))
    roles = [e for e in out if isinstance(e, dict) and e["choices"]
             and "role" in e["choices"][0]["delta"]]  # fmt: skip
    assert len(roles) == 1


def test_line_separators_in_content_are_escaped_for_line_based_readers() -> None:
    g = gate(hold=4)
    out = run(g, sse("chatcmpl-a", ["a\u2028b\u2029c and more text"]))
    assert "\u2028" not in out and "\u2029" not in out
    assert content_of(events(out)) == "a\u2028b\u2029c and more text"
