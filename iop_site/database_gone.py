"""The control plane while PostgreSQL is gone (R-HA-3, docs/scale-out.md "PostgreSQL gone"):
the admin, the REST API and ``POST /refresh`` answer 503 ``database_unavailable`` with one
sentence, and try the database again at the next request; ``/v1`` never reads the database
(it serves the active snapshot), so it and ``/healthz`` go on answering."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import InterfaceError, OperationalError, close_old_connections, connections
from django.http import HttpRequest, HttpResponse, JsonResponse

from edgekit.http import error_body

DATABASE_ERRORS: tuple[type[BaseException], ...] = (OperationalError, InterfaceError)
RETRY_AFTER_S = 5
DATABASE_GONE = error_body(
    "database_unavailable",
    "the configuration database cannot be reached now, so the admin, the REST API and "
    "/refresh are unavailable while /v1 keeps serving the active configuration",
    type="server_error",
)
RETRY_HEADERS = [(b"retry-after", str(RETRY_AFTER_S).encode())]


def gone_response() -> HttpResponse:
    return JsonResponse(DATABASE_GONE, status=503, headers={"Retry-After": str(RETRY_AFTER_S)})


def forget_broken_connections() -> None:
    """Close this thread's connections that failed, so the next call connects again."""
    close_old_connections()


class DatabaseGoneMiddleware:
    """First in ``MIDDLEWARE``: a database that does not answer is a 503 before any session
    or user lookup, and a query that fails inside a view is one too (never a 500 page)."""

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        try:
            connections["default"].ensure_connection()
        except DATABASE_ERRORS:
            forget_broken_connections()
            return gone_response()
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, DATABASE_ERRORS):
            return gone_response()
        return None
