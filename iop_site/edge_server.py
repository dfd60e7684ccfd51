"""daphne's ``Server`` with a drain on SIGTERM/SIGINT.

Imported only from ``iop_site.server.serve``, after ``daphne.server`` has installed the
asyncio reactor.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from daphne.server import Server
from twisted.internet import defer

from iop_site.runtime import EdgeRuntime
from iop_site.twisted_guards import attach_flow

log = logging.getLogger("iop.edge")


class EdgeServer(Server):  # type: ignore[misc]
    """Stops taking requests on the public listener, lets the running and queued ones
    finish (bounded by ``grace_s``), closes the runtime (Node sessions, last usage rows),
    and only then lets daphne cancel what is left."""

    def __init__(
        self, application: Any, *, runtime: EdgeRuntime, public_port: int, grace_s: float,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(application, **kwargs)
        self.runtime = runtime
        self.public_port = public_port
        self.grace_s = grace_s
        self.ports: list[Any] = []
        self.listen_failures: list[str] = []

    def listen_error(self, failure: Any) -> None:
        """Remember why a listener could not bind; ``serve`` turns it into a non-zero exit."""
        self.listen_failures.append(str(failure.getErrorMessage()))
        self.stop()

    def run(self) -> None:
        from twisted.internet import reactor

        reactor.callLater(0, self.runtime.start)  # first thing once the loop runs
        super().run()

    def listen_success(self, port: Any) -> None:
        self.ports.append(port)
        super().listen_success(port)

    def create_application(self, protocol: Any, scope: dict[str, Any]) -> Any:
        if scope["type"] == "http":
            attach_flow(protocol, scope)  # R-IN-5: the relay sees the client's write buffer
        return super().create_application(protocol, scope)

    def kill_all_applications(self) -> defer.Deferred[Any]:
        drained = defer.Deferred.fromFuture(asyncio.ensure_future(self.drain()))
        drained.addBoth(lambda _: Server.kill_all_applications(self))
        return drained

    async def drain(self) -> None:
        self.runtime.draining = True
        for port in self.ports:  # Nodes and the control listener stay: runs must still end
            if port.getHost().port == self.public_port:
                port.stopListening()
        deadline = time.monotonic() + self.grace_s
        pool = self.runtime.pool
        if not pool.idle():
            log.info("stopping: waiting up to %.0f s for running requests", self.grace_s)
        while not pool.idle() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # shutdown only: a short poll beats wiring an event
        if not pool.idle():
            log.warning("stopping with requests still running after %.0f s", self.grace_s)
        await self.runtime.aclose()
