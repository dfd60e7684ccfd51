"""How deep a request body may nest, in process (R-IN-3, docs/http-api.md): up to
``MAX_NESTING`` levels of arrays and objects it is dispatched; any deeper it is 400
``invalid_request``, also at the depths the parser still follows but re-encoding the body for
the Node would not (those were a 500)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import msgspec
import pytest

from pool.http.app import OpenAIApp
from pool.http.operations import ENDPOINTS, MAX_NESTING, TOO_DEEP, nested_deeper_than
from tests.support.inprocess import FakeNode, Runtime, api, document

BODIES = {  # path -> a body whose one list field holds {} as its innermost value
    "/v1/chat/completions": b'{"model":"gpt","messages":%s}',
    "/v1/responses": b'{"model":"gpt","input":%s}',
    "/v1/messages": b'{"model":"claude","max_tokens":5,"messages":%s}',
}


def nested(path: str, levels: int) -> bytes:
    """A body of ``path`` whose arrays and objects nest exactly ``levels`` deep."""
    inner = levels - 2  # the top-level object and the innermost {} are two of them
    return BODIES[path] % (b"[" * inner + b"{}" + b"]" * inner)


@pytest.fixture
async def edge() -> Any:
    runtime = Runtime(document(max_request_bytes=64 * 1024))
    node = await FakeNode(runtime.hub).start()
    yield OpenAIApp(runtime), node
    await runtime.hub.aclose()
    assert runtime.pool.idle()


def test_the_depth_of_a_body_counts_its_arrays_and_objects_not_brackets_in_its_strings() -> None:
    for path in BODIES:
        body = nested(path, MAX_NESTING)
        assert not nested_deeper_than(MAX_NESTING, body, msgspec.json.decode(body))
        body = nested(path, MAX_NESTING + 1)
        assert nested_deeper_than(MAX_NESTING, body, msgspec.json.decode(body))
    text = b'{"model":"gpt","messages":[{"role":"user","content":"%s"}]}' % (b"[{" * 500)
    assert not nested_deeper_than(3, text, msgspec.json.decode(text))
    wide = b'{"model":"gpt","messages":[%s]}' % b",".join([b"[{}]"] * 500)
    assert not nested_deeper_than(4, wide, msgspec.json.decode(wide))
    assert nested_deeper_than(3, wide, msgspec.json.decode(wide))


@pytest.mark.parametrize("path", sorted(BODIES))
async def test_r_in_3_a_body_at_the_nesting_limit_is_dispatched_and_one_level_more_is_a_400(
    edge: Any, path: str
) -> None:
    app, node = edge
    call = await api(app, "POST", path, nested(path, MAX_NESTING)).done()
    assert call.status == 200, call.body
    assert len(node.runs) == 1
    call = await api(app, "POST", path, nested(path, MAX_NESTING + 1)).done()
    assert call.status == 400, call.body
    error = call.json()["error"]
    assert error["message"] == TOO_DEEP
    if ENDPOINTS[path].anthropic:
        assert error["type"] == "invalid_request_error"
    else:
        assert error["code"] == "invalid_request"
    assert len(node.runs) == 1


@pytest.mark.parametrize("path", sorted(BODIES))
async def test_r_in_3_no_depth_up_to_the_recursion_limit_is_a_500(
    edge: Any, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every depth from the limit to past what the parser follows: the window where the body
    decodes but cannot be encoded again lies somewhere in it, wherever the call stack puts it."""
    app, node = edge
    statuses: dict[int, int] = {}
    with caplog.at_level(logging.WARNING):
        for levels in range(MAX_NESTING + 1, sys.getrecursionlimit() + 10):
            call = await api(app, "POST", path, nested(path, levels)).done()
            statuses[levels] = call.status
    assert set(statuses.values()) == {400}, {k: v for k, v in statuses.items() if v != 400}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert node.runs == []
