"""JSON replies, the error body, bounded body reads and the loopback check, for every listener.

Plain ASGI helpers: the public surface (``pool.http``), the control listener and the router
in ``iop_site.asgi`` all answer through these, so an error looks the same on every port.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
HeaderList = Iterable[tuple[bytes, bytes]]


class ClientGone(Exception):
    """The client disconnected before its request body was complete."""


class BodyTooLarge(Exception):
    """The body is, or declares itself, larger than ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the body exceeds {limit} bytes")
        self.limit = limit


class BadContentLength(Exception):
    """The Content-Length header is not a number."""


def presented_bearer(headers: HeaderList) -> bytes | None:
    """The token of the first ``Authorization: Bearer <token>`` header, or None."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            token = token.strip()
            if scheme.lower() == b"bearer" and token:
                return token
            return None
    return None


def is_loopback_peer(scope: Mapping[str, Any]) -> bool:
    """True when the socket peer is a loopback address; a forwarded-for header never counts."""
    client = scope.get("client")
    if not client:
        return False
    try:
        return ipaddress.ip_address(client[0]).is_loopback
    except ValueError:
        return False


# R-CTL-1: the bodies a control request may carry; a web page can send none of them cross-origin
# without a CORS preflight, which the control listener never answers.
CONTROL_CONTENT_TYPES = frozenset(
    {"application/yaml", "application/x-yaml", "text/yaml", "application/json"}
)


def _refresh_type_body() -> dict[str, Any]:
    return error_body(
        "unsupported_media_type",
        "POST /refresh takes Content-Type application/yaml, application/x-yaml, text/yaml or "
        "application/json",
    )


def content_type(headers: HeaderList) -> str:
    """The media type of the Content-Type header, lower-case, without parameters ("" if none)."""
    value = header(headers, b"content-type")
    return "" if value is None else value.decode("latin-1").split(";")[0].strip().lower()


def browser_refusal(scope: Mapping[str, Any]) -> str | None:
    """R-CTL-1: why a request looks like one a web page sent, else None.

    A browser puts ``Origin`` on every cross-origin POST and on fetches; a page reached by DNS
    rebinding sends its own name as ``Host``. Neither is ever needed by ``curl`` or a script
    on the machine, so both are refused outright."""
    headers = scope.get("headers") or ()
    if header(headers, b"origin") is not None:
        return "a request with an Origin header (a web page) is refused"
    host = header(headers, b"host")
    if host is not None and not _own_host(host.decode("latin-1").strip().lower(), scope):
        return "the Host header names neither this listener nor localhost"
    return None


def _own_host(value: str, scope: Mapping[str, Any]) -> bool:
    """``value`` is ``localhost`` or the listener's own address, with no port or its own."""
    if value.startswith("["):  # [v6]:port
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else (None if not rest else "?")
    else:
        name, sep, port_text = value.rpartition(":")
        name, port = (name, port_text) if sep else (value, None)
    server = scope.get("server") or (None, None)
    if port is not None and port != str(server[1]):
        return False
    return name == "localhost" or (server[0] is not None and name == str(server[0]).lower())


LINGER_S = 5.0  # after a refusal, read and discard this long so the client sees the answer


def closing_answer(status: bytes, body: bytes, request_id: str) -> bytes:
    """A whole HTTP/1.1 answer with a JSON body that closes the connection: a refusal a
    listener writes itself, before any app runs (``iop_site.twisted_guards``,
    ``iop_site.public_http``)."""
    return (
        b"HTTP/1.1 " + status + b"\r\n"
        b"content-type: application/json\r\n"
        b"x-request-id: " + request_id.encode() + b"\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n"
        b"connection: close\r\n\r\n" + body
    )


def error_body(
    code: str, message: str, *, type: str = "invalid_request_error", param: str | None = None
) -> dict[str, Any]:
    """The OpenAI-shaped error object every listener answers with (docs/http-api.md)."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


async def send_json(send: Send, status: int, payload: Any, headers: HeaderList = ()) -> None:
    """A complete JSON response (keys sorted, so reports read the same every time)."""
    body = json.dumps(payload, sort_keys=True).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def read_body(receive: Receive, content_length: bytes | None, limit: int) -> bytes:
    """The whole body, or ``BodyTooLarge`` as soon as it is known to exceed ``limit``.

    A declared Content-Length over the limit is refused before reading; a chunked (or
    understated) body is counted as it arrives and refused the moment it passes the limit.
    """
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            raise BadContentLength from None
        if declared > limit:
            raise BodyTooLarge(limit)
    message = await receive()
    if message["type"] != "http.request":
        raise ClientGone
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):  # the common case: one message, no copy
        if len(body) > limit:
            raise BodyTooLarge(limit)
        return body
    parts = [body]
    size = len(body)
    while True:
        if size > limit:
            raise BodyTooLarge(limit)
        message = await receive()
        if message["type"] != "http.request":
            raise ClientGone
        chunk = message.get("body", b"")
        parts.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            break
    if size > limit:
        raise BodyTooLarge(limit)
    return b"".join(parts)


def header(headers: HeaderList, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower-case), or None."""
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


UNSUPPORTED_REFRESH_BODY = _refresh_type_body()  # R-CTL-1: the 415 of POST /refresh
