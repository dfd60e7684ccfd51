"""The control listener on ``admin.listen``: POST /refresh, GET /metrics, GET /pool (R-REF-1).

Loopback only, and only the socket peer counts: a forwarded-for header never makes a request
local. The config key keeps its name ``admin.listen`` (it is the contract); in code this
listener is the *control* listener, so it is never confused with the Django admin.
A request a web page could send (an ``Origin`` header, a foreign ``Host``) is refused
(R-CTL-1, docs/refresh.md). When ``admin.token`` is set, every request must also present it
as a bearer token (docs/configuration.md, "admin"): loopback alone does not tell the operator
from another local process.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

from asgiref.sync import sync_to_async

from catalog.config.secrets import SecretUnavailableError
from edgekit.http import (
    browser_refusal,
    error_body,
    is_loopback_peer,
    presented_bearer,
    send_json,
)
from iop_site.control_refresh import handle_refresh
from iop_site.database_gone import (
    DATABASE_ERRORS,
    DATABASE_GONE,
    RETRY_HEADERS,
    forget_broken_connections,
)
from iop_site.runtime import EdgeRuntime
from pool.engine import PoolBackendUnavailable
from pool.http.metrics import metrics_response

logger = logging.getLogger(__name__)
UNAUTHORIZED = error_body(
    "invalid_api_key",
    "the control listener needs the admin token (Authorization: Bearer)",
    type="authentication_error",
)
POOL_UNAVAILABLE = error_body(
    "pool_unavailable", "the shared provider pool cannot be read now", type="server_error"
)


class ControlApp:
    def __init__(self, runtime: EdgeRuntime) -> None:
        self.runtime = runtime

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not is_loopback_peer(scope):
            await send_json(
                send, 403, error_body("forbidden", "the admin listener is loopback only")
            )
            return
        refusal = browser_refusal(scope)  # R-CTL-1: before the token and before any body
        if refusal is not None:
            await send_json(send, 403, error_body("forbidden", refusal))
            return
        if not self._authorized(scope):
            await send_json(send, 401, UNAUTHORIZED, [(b"www-authenticate", b"Bearer")])
            return
        path, method = scope["path"], scope["method"]
        if path == "/refresh":
            try:
                await handle_refresh(self.runtime, scope, receive, send)
            except DATABASE_ERRORS:  # R-HA-3: nothing was sent yet (the report comes last)
                await sync_to_async(forget_broken_connections)()
                await send_json(send, 503, DATABASE_GONE, RETRY_HEADERS)
        elif path == "/metrics" and method == "GET":
            await metrics_response(self.runtime, send)
        elif path == "/pool" and method == "GET":
            await self._pool(send)
        else:
            await send_json(send, 404, error_body("not_found", "not found"))

    async def _pool(self, send: Any) -> None:
        """The pool as this Edge sees it, never older than the stated age (R-SCALE-8)."""
        try:
            status = await self.runtime.pool_status()
        except PoolBackendUnavailable:
            await send_json(send, 503, POOL_UNAVAILABLE, [(b"retry-after", b"1")])
            return
        await send_json(send, 200, status | self.runtime.relay_status())

    def _authorized(self, scope: dict[str, Any]) -> bool:
        """No token configured: loopback is enough. Otherwise the presented bearer token must
        match, compared in constant time; a token that cannot be read refuses every request."""
        ref = self.runtime.snapshot.admin_token
        if ref is None:
            return True
        presented = presented_bearer(scope.get("headers") or ())
        try:
            expected = ref.resolve().encode()
        except SecretUnavailableError as exc:
            logger.warning("control request refused: %s", exc)  # names the reference only
            return False
        return presented is not None and hmac.compare_digest(presented, expected)
