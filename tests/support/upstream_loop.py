"""Fake upstreams (``tests.fakes``) on their own event loop, so sync tests can drive them."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any


class FakeUpstream:
    """A fake upstream server on its own loop in a daemon thread."""

    def __init__(self, kind: str = "openai") -> None:
        self.kind = kind
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, daemon=True, name=f"fake-{kind}"
        )
        self._thread.start()
        self.server: Any = self.call(self._start())

    async def _start(self) -> Any:
        from tests.fakes import FakeAnthropic, FakeOllama, FakeOpenAI

        kinds = {"openai": FakeOpenAI, "ollama": FakeOllama, "anthropic": FakeAnthropic}
        server = kinds[self.kind]()
        return await server.start()

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def url(self) -> str:
        return str(self.server.url)

    def reset(self) -> None:
        from tests.fakes import Faults

        async def _reset() -> None:
            self.server.requests.clear()
            self.server.faults = Faults()
            self.server.disconnected.clear()
            self.server.streaming.clear()

        self.call(_reset())

    def go_down(self) -> None:
        """Stop listening: connections to its port are refused until ``come_back``."""
        self.call(self.server.close())

    def come_back(self) -> None:
        """Listen again on the same port."""
        self.call(self.server.start(self.server.port))

    def wait_disconnect(self, timeout: float = 5.0) -> bool:
        async def _wait() -> bool:
            try:
                async with asyncio.timeout(timeout):
                    await self.server.disconnected.wait()
            except TimeoutError:
                return False
            return True

        return bool(self.call(_wait(), timeout + 2))

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self.call(self.server.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


class Hold:
    """Holds every streamed response of an upstream after its first chunk until released."""

    def __init__(self, upstream: FakeUpstream, timeout_s: float = 10.0) -> None:
        self.upstream = upstream
        self.timeout_s = timeout_s

        async def install() -> asyncio.Event:
            event = asyncio.Event()
            self.upstream.server.faults.hold_mid_stream = event
            return event

        self.event: asyncio.Event = self.upstream.call(install())

    def release(self) -> None:
        async def release() -> None:
            self.event.set()

        self.upstream.call(release())

    def wait_streaming(self) -> None:
        """Until a streamed response has sent its first chunk (and is now held)."""

        async def wait() -> None:
            async with asyncio.timeout(self.timeout_s):
                await self.upstream.server.streaming.wait()

        self.upstream.call(wait(), self.timeout_s + 1)

    def upstream_models(self) -> list[str]:
        return [r.json["model"] for r in self.upstream.server.requests if r.json]
