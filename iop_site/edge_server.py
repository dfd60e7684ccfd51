"""daphne's ``Server`` with the public listener beside it and a drain on SIGTERM/SIGINT.

Imported only from ``iop_site.server.serve``, after ``daphne.server`` has installed the
asyncio reactor.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from daphne.server import Server
from twisted.internet import defer

from iop_site.public_http import PublicServer
from iop_site.runtime import EdgeRuntime
from iop_site.twisted_guards import attach_flow, attach_peer_names

log = logging.getLogger("iop.edge")


def route_twisted_log() -> Any:
    """Twisted's own log events go through the standard logging (logger ``twisted``), so its
    warnings and errors are written like every other line (R-OBS-4). daphne, at verbosity 0,
    sends them nowhere; this adds an observer beside its, and returns it."""
    from twisted.logger import STDLibLogObserver, globalLogPublisher

    observer = STDLibLogObserver("twisted")
    globalLogPublisher.addObserver(observer)
    return observer


class EdgeServer(Server):  # type: ignore[misc]
    """daphne's listeners (Nodes, control) and the public one (``public``, served on the same
    loop once it runs). On a stop: no new public connection, the running and queued requests
    finish (bounded by ``grace_s``), the runtime closes (Node sessions, last usage rows), the
    public connections end, and only then daphne cancels what is left."""

    def __init__(
        self, application: Any, *, runtime: EdgeRuntime, public: PublicServer | None,
        grace_s: float, on_ready: Callable[[], None] | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(application, **kwargs)
        self.runtime = runtime
        self.public = public
        self.grace_s = grace_s
        self.on_ready = on_ready
        self.ports: list[Any] = []
        self.listen_failures: list[str] = []
        self.start_failures: list[str] = []
        self._starting: asyncio.Future[None] | None = None

    def listen_error(self, failure: Any) -> None:
        """Remember why a listener could not bind; ``serve`` turns it into a non-zero exit."""
        self.listen_failures.append(str(failure.getErrorMessage()))
        self.stop()

    def run(self) -> None:
        from twisted.internet import reactor

        reactor.callLater(0, self._start_runtime)  # first thing once the loop runs
        super().run()

    def _start_runtime(self) -> None:
        route_twisted_log()
        self.runtime.start()
        self._starting = asyncio.ensure_future(self._start_serving())
        self._starting.add_done_callback(self._started)

    async def _start_serving(self) -> None:
        await self.runtime.start_companions()
        if self.public is not None:
            await self.public.start(self.application)

    def _started(self, done: asyncio.Future[None]) -> None:
        """Ready once the runtime's companions run (scale-out: the pool engine, the run
        router); a companion that cannot start stops the Edge with its reason."""
        if done.cancelled():
            return
        failure = done.exception()
        if failure is not None:
            self.start_failures.append(str(failure) or type(failure).__name__)
            self.stop()
        elif self.on_ready is not None and not self.listen_failures:
            self.on_ready()

    def listen_success(self, port: Any) -> None:
        self.ports.append(port)
        super().listen_success(port)

    def create_application(self, protocol: Any, scope: dict[str, Any]) -> Any:
        if scope["type"] == "http":
            attach_flow(protocol, scope)  # R-IN-5: the relay sees the client's write buffer
        elif scope["type"] == "websocket":
            attach_peer_names(protocol, scope)  # the Node's certificate names its node id
        return super().create_application(protocol, scope)

    def kill_all_applications(self) -> defer.Deferred[Any]:
        drained = defer.Deferred.fromFuture(asyncio.ensure_future(self.drain()))
        drained.addBoth(lambda _: Server.kill_all_applications(self))
        return drained

    async def drain(self) -> None:
        self.runtime.draining = True
        if self.public is not None:  # Nodes and the control listener stay: runs must end
            self.public.stop_accepting()
        deadline = time.monotonic() + self.grace_s
        pool = self.runtime.pool
        if not pool.idle():
            log.info("stopping: waiting up to %.0f s for running requests", self.grace_s)
        while not pool.idle() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # shutdown only: a short poll beats wiring an event
        if not pool.idle():
            log.warning("stopping with requests still running after %.0f s", self.grace_s)
        await self.runtime.aclose()
        if self.public is not None:
            await self.public.aclose(grace_s=1.0)
