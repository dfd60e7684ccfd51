"""The control listener on ``admin.listen``: POST /refresh, GET /metrics, GET /pool (R-REF-1).

Loopback only, and only the socket peer counts: a forwarded-for header never makes a request
local. The config key keeps its name ``admin.listen`` (it is the contract); in code this
listener is the *control* listener, so it is never confused with the Django admin.
"""

from __future__ import annotations

from typing import Any

from edgekit.http import error_body, is_loopback_peer, send_json
from iop_site.control_refresh import handle_refresh
from iop_site.runtime import EdgeRuntime
from pool.http.metrics import metrics_response


class ControlApp:
    def __init__(self, runtime: EdgeRuntime) -> None:
        self.runtime = runtime

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not is_loopback_peer(scope):
            await send_json(
                send, 403, error_body("forbidden", "the admin listener is loopback only")
            )
            return
        path, method = scope["path"], scope["method"]
        if path == "/refresh":
            await handle_refresh(self.runtime, scope, receive, send)
        elif path == "/metrics" and method == "GET":
            await metrics_response(self.runtime, send)
        elif path == "/pool" and method == "GET":
            await send_json(send, 200, self.runtime.pool_status() | self.runtime.relay_status())
        else:
            await send_json(send, 404, error_body("not_found", "not found"))
