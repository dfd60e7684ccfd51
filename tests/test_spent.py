"""What a request spent (R-BUD-2): terminal events, the text estimate, and in process a
client leaving after the terminal event (complete, upstream usage) or before it (cut,
estimated from the model text, not the bytes)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from nodes import wire
from pool.http.spent import SAMPLE_PIECES, TextTally, ends_stream, text_chars, tokens_of
from tests.support.inprocess import WAIT, FakeNode, api, chat, document, started, stop, until


@pytest.mark.parametrize(
    ("body", "ends"),
    [
        (b"data: [DONE]\n\n", True),
        (b'data: {"x":1}\n\ndata: [DONE]\n\n', True),
        (b"event: message_stop\ndata: {}\n\n", True),
        (b'event: response.completed\ndata: {"type":"response.completed"}\n\n', True),
        (b'data: {"content":"data: [DONE]"}\n\n', False),  # model text quoting it
        (b'data: {"content":"\\nevent: message_stop"}\n\n', False),  # an escaped newline
        (b"event: message_delta\ndata: {}\n\n", False),
    ],
)
def test_the_terminal_event_is_matched_at_a_line_start_only_r_bud_2(body: bytes, ends: bool):
    """R-BUD-2: model text that quotes a terminal event never completes a stream."""
    assert ends_stream(body) is ends


def test_the_estimate_counts_model_text_not_framing_r_bud_2():
    """R-BUD-2: the text fields of Chat, Messages and Responses events, escapes as written."""
    chunk = (
        'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m",'
        '"choices":[{"index":0,"delta":{"content":"Hello there"},"finish_reason":null}]}\n\n'
    )
    assert text_chars(chunk) == len("Hello there")
    messages = (
        'event: content_block_delta\ndata: {"delta":{"type":"text_delta","text":"ab\\"c"}}\n\n'
    )
    assert text_chars(messages) == len('ab\\"c')
    responses = 'data: {"type":"response.output_text.delta","delta":"xyz"}\n\n'
    assert text_chars(responses) == 3
    assert tokens_of(0) == 0 and tokens_of(1) == 1 and tokens_of(8) == 2


def sse(content: str) -> str:
    chunk = {"object": "chat.completion.chunk", "choices": [{"delta": {"content": content}}]}
    return f"data: {json.dumps(chunk)}\n\n"


async def test_a_client_leaving_after_done_waits_for_the_usage_r_bud_2() -> None:
    """R-BUD-2: [DONE] went out, the client left, the run's end came later with the
    upstream's usage: the request is ok, metered with that usage, not estimated."""
    app, runtime, node = await started(document())

    async def done_then_usage(node: FakeNode, run: Any) -> None:
        await node.emit(run.run_id, sse("hi") + "data: [DONE]\n\n")
        await node.release.wait()  # the upstream still holds its end open
        await node.end(run.run_id, usage=wire.Usage(input_tokens=12, output_tokens=20))

    node.script = done_then_usage
    call = api(app, "POST", "/v1/chat/completions", chat(stream=True))
    await call.wait_for(lambda: b"[DONE]" in call.body)
    call.disconnect()
    await until(call.inbox.empty)  # the watch took the disconnect: the request goes on
    assert not node.cancelled and not call.task.done()
    node.release.set()
    await call.done()
    (record,) = runtime.meter.records
    assert (record.status, record.code, record.estimated) == (200, None, False)
    assert (record.input_tokens, record.output_tokens) == (12, 20)
    await stop(runtime)


async def test_a_stream_cut_after_its_first_byte_is_estimated_from_its_text_r_bud_2() -> None:
    """R-BUD-2: the client left mid-stream: output estimated from the model text relayed
    (40 characters -> 10 tokens), not from the SSE bytes (several times more)."""
    app, runtime, node = await started(document())

    async def endless(node: FakeNode, run: Any) -> None:
        await node.emit(run.run_id, sse("a" * 20) + sse("b" * 20))
        await node.release.wait()

    node.script = endless
    call = api(app, "POST", "/v1/chat/completions", chat(stream=True))
    await call.wait_for(lambda: b"bbbb" in call.body)
    call.disconnect()
    await call.done()
    async with asyncio.timeout(WAIT):
        await node.cancel_seen.wait()
    (record,) = runtime.meter.records
    assert (record.status, record.code, record.estimated) == (499, "client_closed", True)
    assert record.output_tokens == 10 and len(call.body) > 4 * 10 * 2
    node.release.set()
    await stop(runtime)


def test_a_long_stream_is_tallied_by_its_sample_ratio_r_bud_2():
    """R-BUD-2: after the sampled pieces, pieces count by bytes at the sample's text ratio."""
    tally = TextTally()
    piece = sse("abcd")  # 4 characters of text in a few dozen bytes of framing
    for _ in range(SAMPLE_PIECES + 84):
        tally.add(piece)
    assert tally.chars == 4 * (SAMPLE_PIECES + 84)
    assert TextTally().chars == 0
