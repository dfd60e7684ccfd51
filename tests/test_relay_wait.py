"""A run's output is awaited with a deadline (the silence backstop, a stream's pings):
``relay.Within`` keeps ``asyncio.timeout``'s meaning for that one await, and the channel's
``wait`` is a bare future (no coroutine per held stream)."""

from __future__ import annotations

import asyncio

import pytest

from nodes import wire
from nodes.runs import RunChannel
from pool.http.relay import Within


async def test_an_item_that_comes_in_time_is_returned_and_no_cancel_is_left_behind() -> None:
    channel = RunChannel("run-1", "node-1")
    asyncio.get_running_loop().call_later(0.01, channel.feed, "hello")
    with Within(5.0):
        await channel.wait()
    assert channel.get_nowait() == "hello"
    await asyncio.sleep(0)  # a leftover cancel would surface here
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_nothing_within_the_deadline_raises_timeout_and_the_run_goes_on() -> None:
    channel = RunChannel("run-1", "node-1")
    with pytest.raises(TimeoutError), Within(0.01):
        await channel.wait()
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    channel.finish(wire.RunEnd(run_id="run-1", ok=True))
    with Within(5.0):
        await channel.wait()  # the channel still reads
    assert isinstance(channel.get_nowait(), wire.RunEnd)


async def test_a_cancel_from_elsewhere_stays_a_cancel_not_a_timeout() -> None:
    channel = RunChannel("run-1", "node-1")

    async def reader() -> None:
        with Within(5.0):
            await channel.wait()

    waiter = asyncio.create_task(reader())
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    channel.feed("kept")
    assert channel.get_nowait() == "kept"  # what came after is not lost


async def test_a_second_reader_is_refused_and_a_read_queue_is_dropped() -> None:
    channel = RunChannel("run-1", "node-1")
    first = channel.wait()
    with pytest.raises(RuntimeError, match="already has a reader"):
        channel.wait()
    channel.feed("a")
    channel.feed("b")
    await first
    assert [channel.get_nowait(), channel.get_nowait(), channel.get_nowait()] == ["a", "b", None]
    assert channel._items is None  # read: no empty queue kept while the stream waits
    assert await asyncio.wait_for(_after(channel, "c"), 5) == "c"


async def _after(channel: RunChannel, item: str) -> str | wire.RunEnd:
    asyncio.get_running_loop().call_soon(channel.feed, item)
    return await channel.get()
