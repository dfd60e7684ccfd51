"""A run's output is awaited with a deadline (the silence backstop, a stream's pings):
``relay.get_within`` keeps ``asyncio.timeout``'s meaning for that one await."""

from __future__ import annotations

import asyncio

import pytest

from nodes import wire
from nodes.runs import RunChannel
from pool.http.relay import get_within


async def test_an_item_that_comes_in_time_is_returned_and_no_cancel_is_left_behind() -> None:
    channel = RunChannel("run-1", "node-1")
    asyncio.get_running_loop().call_later(0.01, channel.feed, "hello")
    assert await get_within(channel, 5.0) == "hello"
    await asyncio.sleep(0)  # a leftover cancel would surface here
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_nothing_within_the_deadline_raises_timeout_and_the_run_goes_on() -> None:
    channel = RunChannel("run-1", "node-1")
    with pytest.raises(TimeoutError):
        await get_within(channel, 0.01)
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    channel.finish(wire.RunEnd(run_id="run-1", ok=True))
    assert isinstance(await get_within(channel, 5.0), wire.RunEnd)  # the channel still reads


async def test_a_cancel_from_elsewhere_stays_a_cancel_not_a_timeout() -> None:
    channel = RunChannel("run-1", "node-1")
    waiter = asyncio.create_task(get_within(channel, 5.0))
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    channel.feed("kept")
    assert channel.get_nowait() == "kept"  # what came after is not lost
