"""``POST /refresh`` on the loopback control listener: dry-run or apply a candidate (R-REF-1).

The HTTP half only: read and parse the request, then call ``refresh.services`` once and answer
with its report.

Body: ``{"mode": "dry_run"|"apply"|"stage", "config": {...}, "parent": <revision id, optional>}`` as
JSON, or the config document itself as YAML/JSON text with ``?mode=`` (and ``?parent=``); the
Content-Type must say which (R-CTL-1: a form or text/plain body, what a web page can send
without a preflight, is refused with 415 before the body is read).
Only the socket peer address counts; a forwarded-for header never makes a request local.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async

from catalog.config import ConfigError, parse_text
from edgekit.http import (
    CONTROL_CONTENT_TYPES,
    UNSUPPORTED_REFRESH_BODY,
    BadContentLength,
    BodyTooLarge,
    ClientGone,
    content_type,
    error_body,
    header,
    is_loopback_peer,
    read_body,
    send_json,
)
from refresh import services
from refresh.models import ConfigRevision
from refresh.report import error_report

if TYPE_CHECKING:
    from iop_site.runtime import EdgeRuntime

MAX_BODY_BYTES = 4 * 1024 * 1024
MODES = (services.DRY_RUN, services.APPLY, services.STAGE)
AUTHOR = "POST /refresh"


class BadRequest(Exception):
    """The request cannot be read as a refresh call; the message says why (no body echoed)."""


async def handle_refresh(
    runtime: EdgeRuntime, scope: dict[str, Any], receive: Any, send: Any
) -> None:
    """Parse, call the refresh service once, answer with its report and status."""
    if not is_loopback_peer(scope):
        await send_json(send, 403, error_body("forbidden", "POST /refresh is loopback only"))
        return
    if scope.get("method") != "POST":
        await send_json(
            send, 405, error_body("method_not_allowed", "use POST"), [(b"allow", b"POST")]
        )
        return
    if content_type(scope.get("headers", ())) not in CONTROL_CONTENT_TYPES:  # R-CTL-1
        await send_json(send, 415, UNSUPPORTED_REFRESH_BODY)
        return
    query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
    mode = query.get("mode", "")
    try:
        body = await _read_body(scope, receive)
        mode, document, parent = _parse(scope, body, query)
    except BodyTooLarge:
        await send_json(
            send,
            413,
            error_body("request_too_large", f"the body is larger than {MAX_BODY_BYTES} bytes"),
        )
        return
    except BadRequest as exc:
        report = error_report(mode or "unknown", "bad_request", [("<body>", str(exc))])
        await send_json(send, 400, report.as_dict())
        return
    except ConfigError as exc:
        issues = [(issue.path, issue.message) for issue in exc.issues]
        await send_json(send, 400, error_report(mode, "invalid", issues).as_dict())
        return
    if mode == services.DRY_RUN:
        outcome = await sync_to_async(services.dry_run)(document, runtime)
    elif mode == services.STAGE:
        outcome = await sync_to_async(services.stage_document)(
            document, source=str(ConfigRevision.Source.REFRESH), author_label=AUTHOR
        )
    else:
        outcome = await sync_to_async(services.apply_document)(
            runtime,
            document,
            source=str(ConfigRevision.Source.REFRESH),
            author_label=AUTHOR,
            parent=parent,
        )
    outcome = await sync_to_async(services.with_active)(outcome)
    await send_json(send, outcome.status, outcome.body)


async def _read_body(scope: dict[str, Any], receive: Any) -> bytes:
    try:
        return await read_body(
            receive, header(scope.get("headers", ()), b"content-length"), MAX_BODY_BYTES
        )
    except ClientGone:
        raise BadRequest("the client went away before the body was complete") from None
    except BadContentLength:
        raise BadRequest("Content-Length is not a number") from None


def _parse(
    scope: dict[str, Any], body: bytes, query: dict[str, str]
) -> tuple[str, Any, int | None]:
    """(mode, document, parent) from a JSON envelope or a bare YAML/JSON document."""
    mode, parent = query.get("mode"), query.get("parent")
    if content_type(scope.get("headers", ())) == "application/json":
        try:
            envelope = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):  # R-IN-3
            raise BadRequest("the body is not valid JSON") from None
        if not isinstance(envelope, dict) or "config" not in envelope:
            raise BadRequest('a JSON body is {"mode": "dry_run"|"apply"|"stage", "config": {...}}')
        mode = envelope.get("mode", mode)
        parent = envelope.get("parent", parent)
        document = envelope["config"]
    else:
        document = None
    if mode not in MODES:
        raise BadRequest('mode must be "dry_run", "apply" or "stage"')
    if document is None:
        document = parse_text(body)
    return str(mode), document, _parent(parent)


def _parent(value: Any) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise BadRequest("parent must be a revision id")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise BadRequest("parent must be a revision id") from None
