"""The loopback admin listener: POST /refresh, GET /metrics, GET /pool (R-REF-1).

Only the socket peer counts: a forwarded-for header never makes a request local.
"""

from __future__ import annotations

import ipaddress
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pool.runtime import EdgeRuntime


def is_loopback_peer(scope: dict[str, Any]) -> bool:
    client = scope.get("client")
    if not client:
        return False
    try:
        return ipaddress.ip_address(client[0]).is_loopback
    except ValueError:
        return False


async def send_json(
    send: Any, status: int, payload: Any, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    body = json.dumps(payload, sort_keys=True).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


def error_body(code: str, message: str) -> dict[str, Any]:
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    }


class AdminApp:
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
            from refresh.endpoint import handle_refresh

            await handle_refresh(self.runtime, scope, receive, send)
        elif path == "/metrics" and method == "GET":
            from pool.metrics import metrics_response

            await metrics_response(self.runtime, send)
        elif path == "/pool" and method == "GET":
            await send_json(send, 200, self.runtime.pool.snapshot().as_dict())
        else:
            await send_json(send, 404, error_body("not_found", "not found"))
