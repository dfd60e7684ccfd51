"""Start the Edge under daphne on the listeners of the active snapshot."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from catalog.config import EdgeSnapshot
from nodes import wire
from obskit.otel import TracingConfigError, start_tracing

if TYPE_CHECKING:
    from iop_site.tls import Endpoints, Listener
    from pool.http.managed import ManagedKeys

log = logging.getLogger("iop.edge")


def _tune_daphne() -> None:
    """Two Twisted costs daphne never needs, measured at ~20% of Edge CPU per request
    (docs/performance.md): parsing every POST's Content-Type with the stdlib ``email``
    package to fill ``request.args`` (daphne reads the body itself), and formatting an
    access-log line per request even with ``action_logger=None``."""
    from daphne import http_protocol

    base = http_protocol.WebRequest
    if getattr(base, "iop_tuned", False):
        return

    class WebRequest(base):  # type: ignore[misc, valid-type]
        iop_tuned = True

        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            self._parsePOSTFormSubmission = False

    http_protocol.WebRequest = WebRequest  # looked up by HTTPFactory.buildProtocol
    http_protocol.HTTPFactory.log = lambda self, request: None


class ListenError(RuntimeError):
    """A listener could not bind: the Edge did not start."""

    def __init__(self, failures: list[str]) -> None:
        super().__init__("; ".join(failures))
        self.failures = failures


class StartError(RuntimeError):
    """Something the Edge runs beside its listeners could not start: the Edge stopped."""

    def __init__(self, failures: list[str]) -> None:
        super().__init__("; ".join(failures))
        self.failures = failures


def ports_in_use(listeners: list[Listener]) -> list[str]:
    """The listen addresses another socket holds now: checked before the start activates its
    revision (R-CFG-14); daphne binds them for real a moment later."""
    busy = []
    for listener in listeners:
        host = listener.listen.host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Twisted binds
            try:
                probe.bind((host, listener.listen.port))
            except OSError as exc:
                busy.append(f"{listener.role}.listen {listener.listen}: {exc.strerror}")
    return busy


def serve(
    snapshot: EdgeSnapshot,
    *,
    revision: int | None = None,
    edge_id: str = "edge",
    endpoints: Endpoints | None = None,
    managed_keys: ManagedKeys | None = None,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Run until SIGINT/SIGTERM, then drain. daphne.server must be imported before the reactor.
    Raises ``TLSFileError`` before listening when a TLS file cannot be used (R-TLS-1), and
    ``ScaleOutRefused`` when scale-out is set but cannot run (iop_site.scale). ``managed_keys``:
    the managed key files, read once at start (R-MGD-7)."""
    import daphne.server  # noqa: F401  (installs the asyncio reactor first)

    from iop_site.tls import Endpoints, listeners

    if endpoints is None:
        endpoints = Endpoints(listeners(snapshot))
    endpoints.install()

    _tune_daphne()
    from iop_site import twisted_guards

    twisted_guards.install(
        max_body_bytes=snapshot.max_request_bytes,
        header_timeout_s=snapshot.header_timeout_s,
        control_port=snapshot.admin_listen.port,
    )

    from django.conf import settings

    from edgekit.running import attach_runtime
    from iop_site import scale
    from iop_site.asgi import build_application
    from iop_site.edge_server import EdgeServer
    from iop_site.public_http import Guard, PublicServer
    from iop_site.runtime import EdgeRuntime
    from nodes.heap import settle_heap
    from pool.policy import policy_from_snapshot

    clock = time.monotonic
    pool = scale.build_pool(
        policy_from_snapshot(snapshot, version=revision or 0),
        scale=settings.IOP_SCALE,
        edge_id=edge_id,
        clock=clock,
    )
    runtime = EdgeRuntime(
        snapshot,
        revision=revision,
        pool=pool,
        clock=clock,
        heartbeat_interval_s=settings.IOP_NODE_HEARTBEAT_INTERVAL_S,
        heartbeat_timeout_s=settings.IOP_NODE_HEARTBEAT_TIMEOUT_S,
        managed_keys=managed_keys,
    )
    runtime.companions = scale.companions(runtime, scale=settings.IOP_SCALE, edge_id=edge_id)
    if managed_keys is not None:  # R-MGD-12: the route table follows other processes' changes
        from iop_site.credential_watch import CredentialWatcher

        poll_s = settings.IOP_SCALE.revision_poll_s
        runtime.companions.append(CredentialWatcher(managed_keys, poll_s=poll_s))
    try:  # R-OBS-2: only when OTEL_* asks for traces; otherwise nothing of the SDK loads
        runtime.tracing = start_tracing("iop-edge")
    except TracingConfigError as exc:
        raise StartError([str(exc)]) from None
    attach_runtime(runtime)
    public = None
    if endpoints.public is not None:  # iop_site/public_http.py: not daphne's
        guard = Guard(snapshot.max_request_bytes, snapshot.header_timeout_s)
        listen = endpoints.public.listen
        public = PublicServer(listen.host, listen.port, guard, endpoints.public_ssl)
    server = EdgeServer(
        build_application(runtime),
        runtime=runtime,
        public=public,
        grace_s=settings.IOP_SHUTDOWN_GRACE_S,
        on_ready=on_ready,
        endpoints=endpoints.descriptions,
        signal_handlers=True,
        action_logger=None,  # the access log writes on the loop (docs/architecture.md)
        websocket_timeout=-1,  # never drop Nodes after a day
        websocket_max_message_size=wire.MAX_MESSAGE_BYTES,
        websocket_max_frame_size=wire.MAX_MESSAGE_BYTES,
        application_close_timeout=10,
        verbosity=0,
    )
    settle_heap()  # the collector's pauses were the long tail (docs/performance-history.md)
    if public is not None:
        try:
            public.bind()
        except OSError as exc:
            where = f"openai.listen {public.host}:{public.port}"
            raise ListenError([f"{where}: {exc.strerror}"]) from None
    try:
        server.run()
    finally:
        if runtime.tracing is not None:
            runtime.tracing.shutdown()  # bounded: a hanging collector does not hold the exit
    if server.listen_failures:
        raise ListenError(server.listen_failures)
    if server.start_failures:
        raise StartError(server.start_failures)
