"""Flow control on the Edge, in process (R-IN-5): the relay returns credit only for what the
client's socket took, a client that takes nothing is let go, and a Node that sends past its
window loses that run."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from nodes import wire
from nodes.runs import RunChannel, RunOrder
from pool.http.body import ClientGone
from pool.http.relay import Exchange, relay_stream
from tests.support.inprocess import FakeNode, Runtime, document, until


class Flow:
    """A client socket whose write buffer is full until ``resume``."""

    def __init__(self) -> None:
        self.paused = True
        self._resumed = asyncio.Event()

    def resume(self) -> None:
        self.paused = False
        self._resumed.set()

    async def writable(self, timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                await self._resumed.wait()
        except TimeoutError:
            return False
        return True


class Sink:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        self.sent.append(message)


async def test_r_in_5_credit_goes_back_only_once_the_client_socket_took_the_output() -> None:
    """R-IN-5: written but not yet taken counts as buffered; no credit until it drains."""
    grants: list[int] = []
    channel = RunChannel("r1", "n1", window=100, grant=grants.append)
    flow, sink = Flow(), Sink()
    relay = asyncio.ensure_future(relay_stream(channel, Exchange(sink, False, flow)))
    assert channel.feed("x" * 60)
    await until(lambda: channel.held)
    assert (channel.outstanding, grants) == (60, [])
    assert not channel.feed("y" * 41)  # past the window: the hub fails such a run
    flow.resume()
    await until(lambda: not channel.held)
    assert grants == [60] and channel.outstanding == 0
    channel.finish(wire.RunEnd(run_id="r1", ok=True))
    await asyncio.wait_for(relay, 5)


async def test_r_in_5_a_client_that_takes_nothing_within_the_silence_limit_is_gone() -> None:
    """R-IN-5: the relay stops waiting and the request ends as a client that went away."""
    channel = RunChannel("r2", "n1", window=100, grant=lambda _: None)
    channel.feed("data: x\n\n")
    with pytest.raises(ClientGone):
        await relay_stream(channel, Exchange(Sink(), False, Flow()), silence_s=0.05)


async def test_r_in_5_a_node_that_sends_past_its_window_loses_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """R-IN-5: the channel queue stays bounded whatever a Node sends: the run fails and is
    cancelled on the Node. R-OBS-1: the warning, written outside the request's task, still
    names the request."""
    runtime = Runtime(document())
    node = await FakeNode(runtime.hub).start()

    async def flood(node: FakeNode, run: Any) -> None:
        for _ in range(3):
            await node.emit(run.run_id, "z" * 40)

    node.script = flood
    lease = await runtime.pool.acquire("gpt", frozenset({"chat"}))
    spec = RunOrder(
        True, "chat_completions", True, b'{"model":"served-gpt"}', request_id="req-flood"
    )
    channel = await runtime.hub.open_run(lease, spec, window=100)
    assert node.runs[0].credit == 100
    async with asyncio.timeout(5):
        await node.cancel_seen.wait()
    (warning,) = [r for r in caplog.records if "overran its credit" in r.getMessage()]
    assert (warning.request_id, warning.run_id) == ("req-flood", channel.run_id)
    assert channel.end is not None and channel.end.error is not None
    assert channel.end.error.code == "upstream_error"
    runtime.hub.close_run(channel)
    runtime.pool.release(lease)
    assert runtime.hub.relay_buffered() == (0, 0, 0)
    await runtime.hub.aclose()


async def test_a_run_channel_wakes_its_reader_and_refuses_a_second_one() -> None:
    """The channel's one reader waits for output; the end wakes it too; a second reader at
    the same time is a bug, refused loudly rather than left waiting forever."""
    channel = RunChannel("r9", "n1")
    reader = asyncio.create_task(channel.get())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="already has a reader"):
        await channel.get()
    channel.feed("a")
    assert await asyncio.wait_for(reader, 5) == "a"
    waiting = asyncio.create_task(channel.get())
    await asyncio.sleep(0)
    waiting.cancel()  # a reader that gives up (a silence timeout) leaves the channel usable
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    channel.finish(wire.RunEnd(run_id="r9", ok=True))
    end = await asyncio.wait_for(channel.get(), 5)
    assert isinstance(end, wire.RunEnd) and end.ok and channel.get_nowait() is None
