"""The request context every log line and span of a request reads (R-OBS-1, R-OBS-4).

Set once at a door (the Edge's request boundary, the Node's run start) in ``contextvars``;
asyncio tasks copy the context when they are created, so what a request starts inherits it
and no function signature carries a request id.
"""

from __future__ import annotations

import logging
import os
import random
import re
from contextvars import ContextVar

REQUEST_ID_HEADER = "x-request-id"
TRACEPARENT_HEADER = "traceparent"
MAX_REQUEST_ID_CHARS = 128
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
# W3C Trace Context, version 00 only: exactly 55 lowercase characters (a longer or odd value
# is ignored and a new trace starts).
TRACEPARENT_CHARS = 55
_TRACEPARENT = re.compile(rb"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
_ZERO_TRACE, _ZERO_SPAN = b"0" * 32, b"0" * 16

REQUEST_ID: ContextVar[str] = ContextVar("iop_request_id", default="")
RUN_ID: ContextVar[str] = ContextVar("iop_run_id", default="")
TRACE_ID: ContextVar[str] = ContextVar("iop_trace_id", default="")
NODE: ContextVar[str] = ContextVar("iop_node", default="")
PROVIDER: ContextVar[str] = ContextVar("iop_provider", default="")
# The W3C traceparent a run continues (the Node: from the run message).
TRACEPARENT: ContextVar[str] = ContextVar("iop_traceparent", default="")

FIELDS = ("request_id", "run_id", "trace_id", "node", "provider")
_VARS = (REQUEST_ID, RUN_ID, TRACE_ID, NODE, PROVIDER)


# Request ids are no secret (a caller may choose its own): drawn from a generator seeded from
# the system's once per process (and again in a forked child), not a system call per request.
_IDS = random.Random()
os.register_at_fork(after_in_child=_IDS.seed)


def new_request_id() -> str:
    """A fresh request id: 24 hex digits, unique without coordination."""
    return f"{_IDS.getrandbits(96):024x}"


def request_id_from(raw: bytes | None) -> str:
    """The caller's ``x-request-id`` when it is 1..128 characters of ``[A-Za-z0-9._:-]``,
    else a new id (an odd value is replaced, never echoed)."""
    if raw is not None and len(raw) <= MAX_REQUEST_ID_CHARS and _REQUEST_ID.fullmatch(raw):
        return raw.decode("ascii")
    return new_request_id()


def traceparent_from(raw: bytes | str | None) -> str:
    """A valid version-00 ``traceparent``, else "" (malformed, too long, all-zero ids)."""
    if not raw or len(raw) != TRACEPARENT_CHARS:
        return ""
    value = raw.encode("ascii", "replace") if isinstance(raw, str) else raw
    match = _TRACEPARENT.fullmatch(value)
    if match is None or match.group(1) == _ZERO_TRACE or match.group(2) == _ZERO_SPAN:
        return ""
    return value.decode("ascii")


def trace_id_of(traceparent: str) -> str:
    """The 32-hex trace id of a valid traceparent ("" for "")."""
    return traceparent[3:35]


class LogContext(logging.Filter):
    """Puts the request context on every record (installed on each handler, R-OBS-4)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, var in zip(FIELDS, _VARS, strict=True):
            if not hasattr(record, name):
                setattr(record, name, var.get())
        return True
