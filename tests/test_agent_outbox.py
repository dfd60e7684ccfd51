"""Run output coalescing: the first chunk goes at once, later ones batch behind a send."""

from __future__ import annotations

import asyncio

from nodes import wire
from nodes.agent.outbox import RunOutput


class GatedSend:
    """A send that records messages and blocks each call until released."""

    def __init__(self) -> None:
        self.sent: list[wire.NodeToEdge] = []
        self.called = asyncio.Event()
        self.gate = asyncio.Event()

    async def __call__(self, message: wire.NodeToEdge) -> None:
        self.sent.append(message)
        self.called.set()
        await self.gate.wait()


async def test_first_chunk_is_sent_alone_and_chunks_behind_a_send_are_coalesced():
    send = GatedSend()
    out = RunOutput("r1", send)
    await out.emit("first ")
    async with asyncio.timeout(5):
        await send.called.wait()  # sent without waiting for more output
    assert [m.data for m in send.sent] == ["first "]
    for text in ("second ", "third ", "fourth"):
        await out.emit(text)
    send.gate.set()
    await out.drain()
    assert [(m.run_id, m.data) for m in send.sent] == [
        ("r1", "first "),
        ("r1", "second third fourth"),
    ]


async def test_output_larger_than_the_event_limit_is_split_in_order():
    send = GatedSend()
    send.gate.set()
    out = RunOutput("r2", send)
    big = "a" * wire.MAX_EVENT_DATA_CHARS + "b" * wire.MAX_EVENT_DATA_CHARS + "tail"
    await out.emit(big)
    await out.drain()
    sizes = [len(m.data) for m in send.sent]
    assert sizes == [wire.MAX_EVENT_DATA_CHARS, wire.MAX_EVENT_DATA_CHARS, 4]
    assert "".join(m.data for m in send.sent) == big
    assert all(len(wire.encode(m)) <= wire.MAX_MESSAGE_BYTES for m in send.sent)


async def test_drain_with_discard_drops_output_not_yet_sent():
    send = GatedSend()
    out = RunOutput("r3", send)
    await out.emit("sent")
    async with asyncio.timeout(5):
        await send.called.wait()
    await out.emit("dropped")
    send.gate.set()
    await out.drain(discard=True)
    assert [m.data for m in send.sent] == ["sent"]


async def test_a_failed_send_drops_further_output_without_raising():
    async def broken(message: wire.NodeToEdge) -> None:
        raise ConnectionError("gone")

    out = RunOutput("r4", broken)
    await out.emit("x")
    await out.drain()
    assert out.broken
    await out.emit("y")  # no error: the client loop ends the run when the connection drops
    await out.drain()


async def test_a_held_answer_is_sent_with_the_run_end_not_as_an_event():
    """A non-stream run's answer waits for ``last`` and travels in run_end: no run_event."""
    send = GatedSend()
    send.gate.set()
    out = RunOutput("r5", send, credit=100, hold=True)
    await out.emit('{"id":')
    await out.emit('"x"}')
    assert send.sent == [] and out.emitted
    assert await out.last() == '{"id":"x"}'
    assert send.sent == []
    assert await out.last() == ""  # taken once


async def test_a_held_answer_longer_than_the_credit_goes_as_events():
    """R-IN-5: output in run_end counts against the credit; what does not fit is sent as
    run_events, as the credit comes back, and run_end then carries nothing."""
    send = GatedSend()
    send.gate.set()
    out = RunOutput("r6", send, credit=4, hold=True)
    await out.emit("abcdef")
    last = asyncio.create_task(out.last())
    async with asyncio.timeout(5):
        await send.called.wait()
    assert [m.data for m in send.sent] == ["abcd"] and not last.done()
    out.grant(2)
    async with asyncio.timeout(5):
        assert await last == ""
    assert [m.data for m in send.sent] == ["abcd", "ef"]


async def test_held_output_over_the_event_limit_goes_as_events():
    send = GatedSend()
    send.gate.set()
    out = RunOutput("r7", send, hold=True)
    big = "a" * (wire.MAX_EVENT_DATA_CHARS + 1)
    await out.emit(big)
    assert await out.last() == ""
    assert "".join(m.data for m in send.sent) == big and len(send.sent) == 2


async def test_held_output_of_a_run_that_failed_is_still_sent_by_drain():
    """A run that emitted and then failed ends as before: its output in events, then the
    error's run_end (whose phase says output went out)."""
    send = GatedSend()
    send.gate.set()
    out = RunOutput("r8", send, hold=True)
    await out.emit("partial")
    await out.drain()
    assert [m.data for m in send.sent] == ["partial"]
    assert await out.last() == ""
