"""Bounded request body reading for the public surface: ``edgekit.http.read_body`` with the
surface's error codes (``request_too_large``, ``invalid_request``)."""

from __future__ import annotations

from edgekit import http
from edgekit.http import ClientGone, Receive
from pool.http.errors import HttpError, request_too_large

__all__ = ["ClientGone", "Receive", "read_body"]


async def read_body(receive: Receive, content_length: bytes | None, limit: int) -> bytes:
    """The whole body, or ``request_too_large`` as soon as it is known to exceed ``limit``."""
    try:
        return await http.read_body(receive, content_length, limit)
    except http.BodyTooLarge:
        raise request_too_large(limit) from None
    except http.BadContentLength:
        raise HttpError("invalid_request", "Content-Length is not a number") from None
