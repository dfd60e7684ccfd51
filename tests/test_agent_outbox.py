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
