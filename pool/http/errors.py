"""The one error table of the HTTP surface, in OpenAI and Anthropic shapes (docs/http-api.md).

Every refusal the surface makes is an ``HttpError`` whose ``code`` is a row here; nothing
else ever reaches a client (no HTML page, no stack trace).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from edgekit.http import error_body
from nodes import wire
from pool.engine.errors import PoolError

log = logging.getLogger("iop.http")


@dataclass(frozen=True, slots=True)
class Row:
    status: int
    openai_type: str
    anthropic_type: str
    message: str


ERRORS: dict[str, Row] = {
    "invalid_request": Row(
        400, "invalid_request_error", "invalid_request_error", "the request is not valid"
    ),
    "unsupported_operation": Row(
        400,
        "invalid_request_error",
        "invalid_request_error",
        "no provider of this model supports the requested operation",
    ),
    "context_length_exceeded": Row(
        400,
        "invalid_request_error",
        "invalid_request_error",
        "the request is longer than any provider of this model can hold",
    ),
    "invalid_api_key": Row(
        401, "invalid_request_error", "authentication_error", "invalid or missing API key"
    ),
    "provider_credential_refused": Row(
        400,
        "invalid_request_error",
        "invalid_request_error",
        "caller-supplied provider credentials are refused in managed mode",
    ),
    "not_found": Row(404, "invalid_request_error", "not_found_error", "not found"),
    "model_not_found": Row(
        404,
        "invalid_request_error",
        "not_found_error",
        "the requested model does not exist; GET /v1/models lists the models",
    ),
    "method_not_allowed": Row(
        405, "invalid_request_error", "invalid_request_error", "method not allowed"
    ),
    "request_too_large": Row(
        413, "invalid_request_error", "request_too_large", "the request body is too large"
    ),
    "request_headers_too_large": Row(
        431,
        "invalid_request_error",
        "invalid_request_error",
        "the request line and headers are too large",
    ),
    "queue_full": Row(429, "rate_limit_error", "rate_limit_error", "the provider queue is full"),
    "rate_limited": Row(
        429, "rate_limit_error", "rate_limit_error", "rate limit reached for this token"
    ),
    "budget_exceeded": Row(  # R-BUD-1: OpenAI's own type for a spent quota
        429,
        "insufficient_quota",
        "rate_limit_error",
        "this principal's token budget for the period is spent",
    ),
    "internal_error": Row(500, "server_error", "api_error", "internal error"),
    "upstream_error": Row(502, "server_error", "api_error", "the upstream request failed"),
    "repetition_detected": Row(
        502, "server_error", "api_error", "the output kept repeating itself"
    ),
    # R-QUEUE-2: the estimate (or the wait) exceeds the deadline the request stated
    "queue_wait_exceeded": Row(
        429, "rate_limit_error", "rate_limit_error", "the queue wait would exceed the deadline"
    ),
    "queue_timeout": Row(
        503, "server_error", "overloaded_error", "timed out waiting for a free provider"
    ),
    "credential_unavailable": Row(
        503, "server_error", "api_error", "the provider credential cannot be used"
    ),
    "no_available_provider": Row(
        503, "server_error", "overloaded_error", "no provider is available for this model"
    ),
    # Several Edges (docs/pool.md, "Redis engine"): the shared pool store cannot be used now.
    "pool_unavailable": Row(
        503, "server_error", "overloaded_error", "the shared provider pool is unreachable"
    ),
    "pool_recovering": Row(
        503, "server_error", "overloaded_error", "the shared provider pool is recovering"
    ),
    "upstream_timeout": Row(
        504, "server_error", "api_error", "the upstream did not answer in time"
    ),
}

RETRY_AFTER_S = 1  # 429 queue_full: the queue drains as runs end; a short back-off is enough
# 503s of the shared pool store: it comes back by itself, so a client may retry soon.
RETRY_AFTER_CODES = frozenset({"pool_unavailable", "pool_recovering"})

# Node run failures (wire.RunError.code) -> table code; anything else is an upstream error.
_RUN_CODES = {
    "upstream_timeout": "upstream_timeout",
    "unknown_provider": "no_available_provider",
    "repetition_detected": "repetition_detected",  # the gate's exhausted recovery (R-SEG-6)
    "credential_refused": "credential_unavailable",  # R-MGD-4: the Node refused the envelope
    # Run routing between Edges lost Redis: the upstream did nothing wrong, and the client may
    # retry soon (503 with Retry-After, as an admission while Redis is away).
    "relay_unavailable": "pool_unavailable",
}


class HttpError(Exception):
    """A refusal with a table ``code``; ``message`` must be safe to show (never a secret)."""

    def __init__(
        self,
        code: str,
        message: str | None = None,
        param: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        row = ERRORS[code]
        super().__init__(message or row.message)
        self.code = code
        self.row = row
        self.message = message or row.message
        self.param = param
        self._headers = headers

    @property
    def status(self) -> int:
        return self.row.status

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Extra response headers of this error (Retry-After on 429 and on the pool store's
        503s)."""
        if self._headers is not None:
            return self._headers
        if self.row.status == 429 or self.code in RETRY_AFTER_CODES:
            return [(b"retry-after", str(RETRY_AFTER_S).encode())]
        return []


MODELS_HINT = "GET /v1/models lists the models"


def _shown(model: str | None) -> str:
    return json.dumps((model or "")[:100])


def model_not_found(model: str | None) -> HttpError:
    """404 for a model that is not a group, or not one the caller may use: one answer for
    both (R-PRIN-1), naming the model and the next step."""
    return HttpError(
        "model_not_found", f"the model {_shown(model)} does not exist; {MODELS_HINT}", "model"
    )


def from_pool_error(
    exc: PoolError, model: str | None = None, needs: frozenset[str] = frozenset()
) -> HttpError:
    """Map a pool refusal (its ``code`` is already a table row) to the HTTP error; refusals
    about the model name it (``param`` ``model``) and say what to do next."""
    code = exc.code if exc.code in ERRORS else "no_available_provider"
    shown = _shown(model)
    if code == "model_not_found":
        return model_not_found(model)
    if code == "unsupported_operation" and needs:
        wanted = ", ".join(sorted(needs))
        message = (
            f"no provider of the model {shown} has the capabilities this request needs "
            f"({wanted}); use another model ({MODELS_HINT})"
        )
        return HttpError(code, message, "model")
    return HttpError(code, str(exc) or None)


class RunFailed(HttpError):
    """A run that ended in failure before anything reached the client; ``error`` says how
    (the dispatch loop decides from it whether another provider may try, R-HEALTH-1)."""

    def __init__(self, code: str, message: str | None, error: wire.RunError | None) -> None:
        super().__init__(code, message)
        self.error = error


def from_run_error(error: wire.RunError | None, run: str = "?") -> RunFailed:
    """Map a Node run failure to the table: timeouts 504, everything else 502.

    The message is the Node's generic one (``upstream returned HTTP 400``, ``the CLI program
    failed``); the detail stayed in the Node's log line for the run. The failure is logged
    here too, with the run id ``run`` (docs/http-api.md, "Upstream error messages")."""
    if error is None:
        return RunFailed("upstream_error", None, None)
    log.warning(
        "run %s failed: %s%s: %s",
        run,
        error.code,
        f" (HTTP {error.status})" if error.status else "",
        error.message[:300],
    )
    return RunFailed(_RUN_CODES.get(error.code, "upstream_error"), error.message or None, error)


def openai_body(err: HttpError) -> dict[str, Any]:
    return error_body(err.code, err.message, type=err.row.openai_type, param=err.param)


def anthropic_body(err: HttpError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": err.row.anthropic_type, "message": err.message}}


def request_too_large(limit: int) -> HttpError:
    """R-IN-1: a body over ``limit`` bytes, declared or received (every listener's words)."""
    return HttpError("request_too_large", f"the request body exceeds {limit} bytes")


def error_json(err: HttpError, anthropic: bool) -> bytes:
    """The error response body; ASCII-only so it is safe inside SSE lines too."""
    body = anthropic_body(err) if anthropic else openai_body(err)
    return json.dumps(body, ensure_ascii=True, separators=(",", ":")).encode()


def stream_error_event(err: HttpError, anthropic: bool) -> bytes:
    """The in-band event that ends a stream which failed after it started."""
    if anthropic:
        return b"event: error\ndata: " + error_json(err, True) + b"\n\n"
    return b"data: " + error_json(err, False) + b"\n\n"
