"""The relay names the model the client asked for, however the stream is cut (docs/http-api.md)."""

from __future__ import annotations

import itertools
import json

from hypothesis import given
from hypothesis import strategies as st

from pool.http.naming import ModelNames

CHUNK = {"id": "chatcmpl-1", "model": "Org/Served-7B", "choices": [{"delta": {"content": "hi"}}]}
STREAM = (
    "".join(
        f"data: {json.dumps(CHUNK, separators=separators)}\n\n"
        for separators in ((",", ":"), (", ", ": "))
    )
    + "data: [DONE]\n\n"
)


def relayed(text: str, cuts: list[int]) -> str:
    names = ModelNames("qwen-local", "Org/Served-7B")
    bounds = [0, *sorted(set(cuts)), len(text)]
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    return "".join(names.chunk(piece) for piece in pieces) + names.flush()


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_every_chunk_names_the_asked_model_wherever_the_stream_is_cut(cuts: list[int]) -> None:
    out = relayed(STREAM, cuts)
    assert out == ModelNames("qwen-local", "Org/Served-7B").whole(STREAM)
    assert "Org/Served-7B" not in out and out.count("qwen-local") == 2


def test_a_body_whose_model_is_already_the_asked_one_passes_unchanged() -> None:
    names = ModelNames("echo", "echo")
    assert names.chunk(STREAM) == STREAM and names.flush() == ""


def test_only_a_trailing_partial_member_is_held_back() -> None:
    names = ModelNames("a", "served")
    assert names.chunk('data: {"x":1}\n\n') == 'data: {"x":1}\n\n'  # nothing held
    assert names.chunk('data: {"mod') == "data: {"
    assert names.chunk('el":"served"}\n\n') == '"model":"a"}\n\n'
    assert names.flush() == ""


def test_the_text_of_an_answer_is_never_rewritten() -> None:
    """Inside a JSON string the quotes are escaped, so content that mentions it stays."""
    body = json.dumps({"model": "served", "content": '{"model":"served"}'})
    assert json.loads(ModelNames("a", "served").whole(body)) == {
        "model": "a",
        "content": '{"model":"served"}',
    }
