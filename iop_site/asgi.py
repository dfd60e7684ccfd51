"""ASGI entry: one process, three listeners, routed by the port that accepted the socket.

- ``edge.listen``: the Node websocket at /ws/node.
- ``openai.listen``: /v1/* as a plain ASGI app (no Django stack on the hot path), and
  Django (admin, REST API, status page) for everything else.
- ``admin.listen`` (loopback only): the control listener, POST /refresh, GET /metrics and
  GET /pool (``iop_site.control``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "iop_site.settings")

from django.core.asgi import get_asgi_application

from edgekit.http import error_body, send_json

if TYPE_CHECKING:
    from iop_site.runtime import EdgeRuntime

log = logging.getLogger("iop.nodes")
Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]

django_application = get_asgi_application()


async def not_found(scope: Scope, receive: Any, send: Any) -> None:
    if scope["type"] == "websocket":
        log.warning(
            "websocket upgrade refused on %r: Nodes dial /ws/node on edge.listen",
            str(scope.get("path", ""))[:200],
        )
        await send({"type": "websocket.close"})
        return
    await send_json(send, 404, error_body("not_found", "not found"))


def urls_loaded_off_the_loop(site: ASGIApp) -> ASGIApp:
    """``site`` once the URL conf is imported. The first request that needs it imports it in
    a thread (every admin and REST view, about 0.3 s of CPU) while the event loop serves on;
    requests arriving meanwhile wait for the same import (``runedge`` runs no system checks,
    which imported it at start)."""
    from django.urls import get_resolver

    from pool.http.errors import ERRORS

    loading: asyncio.Future[Any] | None = None

    async def first(scope: Scope, receive: Any, send: Any) -> None:
        nonlocal loading
        if loading is None:
            loading = asyncio.ensure_future(asyncio.to_thread(lambda: get_resolver().url_patterns))
        try:
            await asyncio.shield(loading)
        except Exception as exc:  # a defect of the code: one line, never its text or a trace
            log.error("the admin's URL conf failed to load: %s", type(exc).__name__)
            row = ERRORS["internal_error"]
            body = error_body("internal_error", row.message, type=row.openai_type)
            await send_json(send, row.status, body)
            return
        await site(scope, receive, send)

    def application(scope: Scope, receive: Any, send: Any) -> Awaitable[None]:
        if loading is not None and loading.done() and loading.exception() is None:
            return site(scope, receive, send)
        return first(scope, receive, send)

    return application


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def build_application(runtime: EdgeRuntime | None) -> ASGIApp:
    """The process's ASGI app; without a runtime it serves Django only."""
    if runtime is None:
        return django_application  # type: ignore[no-any-return]

    from django.conf import settings
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    from iop_site.control import ControlApp
    from nodes.consumer import NodeConsumer
    from pool.http.app import OpenAIApp
    from pool.http.managed import routed_sealer

    snapshot = runtime.snapshot
    node_ws = NodeConsumer.as_asgi(hub=runtime.hub)
    openai_app = OpenAIApp(
        runtime,
        rate_window_s=settings.IOP_RATE_LIMIT_WINDOW_S,
        tracing=runtime.tracing,
        shared_limits=runtime.shared_limits,  # scale-out (R-SCALE-6)
    )
    control_app = ControlApp(runtime)
    if runtime.hub.remote is not None:  # this Edge issues envelopes for its Nodes (R-SCALE-7)
        runtime.hub.remote.issuer = lambda grant, provider_id: routed_sealer(
            openai_app.tables().managed, grant, provider_id
        )
    # the admin's CSS and JS, from the apps
    site = urls_loaded_off_the_loop(ASGIStaticFilesHandler(django_application))
    roles = {
        snapshot.edge_listen.port: "edge",
        snapshot.admin_listen.port: "control",
        snapshot.openai_listen.port: "openai",
    }

    def application(scope: Scope, receive: Any, send: Any) -> Awaitable[None]:
        """The app this connection's port serves, called at once: a plain function, so no
        frame of its own stays under every held stream (docs/performance-history.md)."""
        kind = scope["type"]
        if kind == "lifespan":
            return _lifespan(receive, send)
        server = scope.get("server") or (None, None)
        role = roles.get(server[1])
        path = scope.get("path", "")
        if role == "openai" and kind == "http":
            if path.startswith("/v1/") or path in ("/metrics", "/healthz"):
                return openai_app(scope, receive, send)
            return site(scope, receive, send)
        if role == "edge" and kind == "websocket" and path == "/ws/node":
            return node_ws(scope, receive, send)  # type: ignore[no-any-return]
        if role == "control" and kind == "http":
            return control_app(scope, receive, send)
        return not_found(scope, receive, send)

    return application


application = build_application(None)
