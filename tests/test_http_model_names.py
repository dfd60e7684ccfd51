"""The relay names the model the client asked for, however the stream is cut (docs/http-api.md)."""

from __future__ import annotations

import itertools
import json

from hypothesis import given
from hypothesis import strategies as st

from pool.http.naming import ModelNames

CHUNK = {"id": "chatcmpl-1", "model": "Org/Served-7B", "choices": [{"delta": {"content": "hi"}}]}
DATED = {"type": "message_start", "message": {"id": "m1", "model": "claude-x-20250101"}}
STREAM = (
    "".join(
        f"data: {json.dumps(event, separators=separators)}\n\n"
        for event in (CHUNK, DATED)
        for separators in ((",", ":"), (", ", ": "))
    )
    + "data: [DONE]\n\n"
)


def relayed(text: str, cuts: list[int]) -> str:
    names = ModelNames("qwen-local")
    bounds = [0, *sorted(set(cuts)), len(text)]
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    return "".join(names.chunk(piece) for piece in pieces) + names.flush()


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_every_chunk_names_the_asked_model_wherever_the_stream_is_cut(cuts: list[int]) -> None:
    out = relayed(STREAM, cuts)
    assert out == ModelNames("qwen-local").whole(STREAM)
    events = [json.loads(line[6:]) for line in out.split("\n\n") if line[6:7] == "{"]
    assert [e.get("model") or e["message"]["model"] for e in events] == ["qwen-local"] * 4
    assert "Served" not in out and "claude-x" not in out


def test_a_stream_without_a_model_member_passes_unchanged() -> None:
    names = ModelNames("echo")
    text = 'data: {"type":"ping"}\n\ndata: [DONE]\n\n'
    assert names.chunk(text) == text and names.flush() == ""


def test_only_a_trailing_partial_member_is_held_back() -> None:
    names = ModelNames("a")
    assert names.chunk('data: {"x":1}\n\n') == 'data: {"x":1}\n\n'  # nothing held
    assert names.chunk('data: {"mod') == "data: {"
    assert names.chunk('el": "served') == ""
    assert names.chunk('"}\n\n') == '"model":"a"}\n\n'
    assert names.flush() == ""


def test_the_text_of_an_answer_is_never_rewritten() -> None:
    """Inside a JSON string the quotes are escaped, so content that mentions it stays."""
    body = json.dumps({"model": "served", "content": '{"model":"served"}'})
    assert json.loads(ModelNames("a").whole(body)) == {
        "model": "a",
        "content": '{"model":"served"}',
    }
