"""The one error table: every row renders in the OpenAI and the Anthropic shape."""

from __future__ import annotations

import json

import pytest

from nodes import wire
from pool.engine.errors import (
    NotAdmitted,
    PoolBackendUnavailable,
    PoolRecovering,
    QueueFull,
    QueueTimeout,
    Unavailable,
    UnknownModel,
)
from pool.http.errors import (
    ERRORS,
    HttpError,
    error_json,
    from_pool_error,
    from_run_error,
    stream_error_event,
)

ISSUE_TABLE = {
    "invalid_request": 400,
    "invalid_api_key": 401,
    "model_not_found": 404,
    "unsupported_operation": 400,
    "request_too_large": 413,
    "queue_full": 429,
    "queue_timeout": 503,
    "no_available_provider": 503,
    "pool_unavailable": 503,
    "pool_recovering": 503,
    "upstream_error": 502,
    "upstream_timeout": 504,
}


def test_the_table_holds_every_documented_row_with_its_status() -> None:
    for code, status in ISSUE_TABLE.items():
        assert ERRORS[code].status == status, code


@pytest.mark.parametrize("code", sorted(ERRORS))
def test_openai_shape_has_message_type_param_and_code(code: str) -> None:
    body = json.loads(error_json(HttpError(code, param="model"), anthropic=False))
    assert set(body) == {"error"}
    assert body["error"] == {
        "message": ERRORS[code].message,
        "type": ERRORS[code].openai_type,
        "param": "model",
        "code": code,
    }


@pytest.mark.parametrize("code", sorted(ERRORS))
def test_anthropic_shape_has_type_error_and_error_type(code: str) -> None:
    body = json.loads(error_json(HttpError(code, "why"), anthropic=True))
    expected = {"type": ERRORS[code].anthropic_type, "message": "why"}
    assert body == {"type": "error", "error": expected}


def test_only_the_429_rows_and_the_shared_pool_503s_carry_retry_after() -> None:
    """R-SCALE-3: the shared pool store's 503s come back by themselves: retry shortly."""
    # budget_exceeded: its refusal always states Retry-After to the period's end (R-BUD-1)
    limited = ("queue_full", "rate_limited", "budget_exceeded", "pool_unavailable",
               "pool_recovering", "queue_wait_exceeded")  # fmt: skip
    for code in limited:
        assert HttpError(code).headers() == [(b"retry-after", b"1")]
    assert all(HttpError(code).headers() == [] for code in ERRORS if code not in limited)
    # R-QUEUE-1: at dispatch a capacity refusal's Retry-After is the queue's drain time
    # (pool.http.queueing.with_retry_after; tests/test_queue_estimate.py)


def test_every_pool_error_maps_to_its_own_row() -> None:
    cases = {
        QueueFull: "queue_full",
        QueueTimeout: "queue_timeout",
        Unavailable: "no_available_provider",
        NotAdmitted: "unsupported_operation",
        UnknownModel: "model_not_found",
        PoolBackendUnavailable: "pool_unavailable",
        PoolRecovering: "pool_recovering",
    }
    for exc_type, code in cases.items():
        assert from_pool_error(exc_type()).code == code


def test_run_failures_map_timeouts_to_504_and_the_rest_to_502() -> None:
    timeout = from_run_error(wire.RunError(code="upstream_timeout", message="slow"))
    assert (timeout.status, timeout.code, timeout.message) == (504, "upstream_timeout", "slow")
    for code in ("upstream_error", "node_gone", "bad_request", "cancelled"):
        assert from_run_error(wire.RunError(code=code, message="x")).status == 502
    assert from_run_error(None).code == "upstream_error"


def test_stream_error_events_are_one_sse_event_in_each_shape() -> None:
    err = HttpError("upstream_error", "broke \u2028 here")
    openai = stream_error_event(err, anthropic=False)
    assert openai.startswith(b"data: {") and openai.endswith(b"\n\n")
    assert json.loads(openai[6:])["error"]["code"] == "upstream_error"
    anthropic = stream_error_event(err, anthropic=True)
    assert anthropic.startswith(b"event: error\ndata: ")
    assert json.loads(anthropic.split(b"data: ", 1)[1])["type"] == "error"
    # U+2028 is escaped: line-based SSE readers never see a broken line.
    assert b"\xe2\x80\xa8" not in openai + anthropic
