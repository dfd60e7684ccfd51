"""Bounded request body reading: the limit holds for Content-Length and chunked bodies alike."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pool.http.errors import HttpError

Receive = Callable[[], Awaitable[dict[str, Any]]]


class ClientGone(Exception):
    """The client disconnected before its request body was complete."""


def _too_large(limit: int) -> HttpError:
    return HttpError("request_too_large", f"the request body exceeds {limit} bytes")


async def read_body(receive: Receive, content_length: bytes | None, limit: int) -> bytes:
    """The whole body, or ``request_too_large`` as soon as it is known to exceed ``limit``.

    A declared Content-Length over the limit is refused before reading; a chunked (or
    understated) body is counted as it arrives and refused the moment it passes the limit.
    """
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            raise HttpError("invalid_request", "Content-Length is not a number") from None
        if declared > limit:
            raise _too_large(limit)
    message = await receive()
    if message["type"] != "http.request":
        raise ClientGone
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):  # the common case: one message, no copy
        if len(body) > limit:
            raise _too_large(limit)
        return body
    parts = [body]
    size = len(body)
    while True:
        if size > limit:
            raise _too_large(limit)
        message = await receive()
        if message["type"] != "http.request":
            raise ClientGone
        chunk = message.get("body", b"")
        parts.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            break
    if size > limit:
        raise _too_large(limit)
    return b"".join(parts)
