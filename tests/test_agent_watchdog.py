"""The Node's per-task deadline (nodes/agent/watchdog.py): one timer, moved not re-made, whose
cancel the guarded await takes back as its own timeout; anyone else's cancel propagates."""

from __future__ import annotations

import asyncio

import pytest

from nodes.agent.watchdog import Watchdog


async def guarded(dog: Watchdog, seconds: float, wait: float) -> str:
    dog.within(seconds)
    try:
        await asyncio.sleep(wait)
    except asyncio.CancelledError:
        if dog.took():
            return "timed out"
        raise
    finally:
        dog.clear()
    return "done"


async def test_a_wait_past_its_due_time_is_its_own_timeout_and_the_task_is_not_cancelled():
    dog = Watchdog()
    assert await guarded(dog, 0.01, 30) == "timed out"
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    assert await guarded(dog, 5, 0) == "done"  # the watchdog goes on guarding
    dog.close()


async def test_a_cleared_deadline_cancels_nothing_though_its_timer_fires():
    dog = Watchdog()
    assert await guarded(dog, 0.01, 0) == "done"
    await asyncio.sleep(0.05)  # the old timer fires now, with no await guarded
    assert not dog.fired
    dog.close()


async def test_a_later_due_time_moves_the_deadline_without_a_new_timer():
    dog = Watchdog()
    dog.within(0.01)
    timer = dog._handle
    dog.clear()
    dog.within(30)  # later: the armed timer stays, and re-arms itself when it fires
    assert dog._handle is timer
    await asyncio.sleep(0.05)
    assert not dog.fired and dog._handle is not timer
    dog.within(0.01)  # earlier than the re-armed one: a new timer
    assert dog._handle is not None and dog._handle.when() < asyncio.get_running_loop().time() + 1
    dog.close()


async def test_a_cancel_from_elsewhere_propagates():
    async def body() -> str:
        dog = Watchdog()
        try:
            return await guarded(dog, 30, 30)
        finally:
            dog.close()

    task = asyncio.create_task(body())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancel_beside_the_watchdogs_own_still_propagates():
    """Both cancels pending: the await was not the watchdog's alone (asyncio.timeout's rule)."""
    taken: list[bool] = []

    async def body() -> None:
        task = asyncio.current_task()
        assert task is not None
        dog = Watchdog()
        dog.within(0.01)
        try:
            await asyncio.sleep(30)  # the watchdog cancels the task here
        except asyncio.CancelledError:
            task.cancel()  # and someone else asks too before it is taken
            taken.append(dog.took())
            raise
        finally:
            dog.close()

    task = asyncio.create_task(body())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert taken == [False]


async def test_a_watchdog_is_made_inside_a_task():
    loop = asyncio.get_running_loop()
    made: asyncio.Future[None] = loop.create_future()

    def outside_any_task() -> None:
        try:
            Watchdog()
        except RuntimeError as exc:
            made.set_exception(exc)
        else:
            made.set_result(None)

    loop.call_soon(outside_any_task)
    with pytest.raises(RuntimeError, match="inside one"):
        await made
