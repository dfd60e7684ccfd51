"""A queue that tells its clients what it knows (R-QUEUE-1, R-QUEUE-2): how long a request
may wait, the refusal when the estimate says it would wait longer, and ``Retry-After`` from
the queue's measured drain rate (pool/engine/estimate.py).

A request's deadline is ``x-iop-max-wait-ms`` (milliseconds), else the client's own read
timeout: ``X-Stainless-Read-Timeout`` (the official OpenAI and Anthropic SDKs), else
``X-Stainless-Timeout`` (the Anthropic SDK), in seconds. A value that is not a plain positive
number, or is above a day, is ignored (docs/http-api.md): the request then waits as any other.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping

from pool.engine import Lease
from pool.engine.estimate import retry_after
from pool.http.errors import HttpError
from pool.http.relay import QUEUE_ETA_HEADER, Exchange

MAX_WAIT_HEADER = b"x-iop-max-wait-ms"
SDK_TIMEOUT_HEADERS = (b"x-stainless-read-timeout", b"x-stainless-timeout")
MAX_DEADLINE_S = 86400.0
_MILLIS = re.compile(rb"[0-9]{1,9}")
_SECONDS = re.compile(rb"[0-9]{1,6}(\.[0-9]{1,6})?")


def deadline_s(headers: Mapping[bytes, bytes] | None) -> float | None:
    """The seconds this request will wait for its first byte; None when it does not say."""
    if not headers:
        return None
    raw = headers.get(MAX_WAIT_HEADER)
    if raw is not None:
        if _MILLIS.fullmatch(raw.strip()):
            return _bounded(int(raw) / 1000)
        return None  # a malformed explicit deadline is ignored, not replaced by the SDK's
    for name in SDK_TIMEOUT_HEADERS:
        raw = headers.get(name)
        if raw is not None and _SECONDS.fullmatch(raw.strip()):
            return _bounded(float(raw))
    return None


def _bounded(seconds: float) -> float | None:
    return seconds if 0 < seconds <= MAX_DEADLINE_S else None


def wait_exceeded(eta_s: float | None, deadline: float) -> HttpError:
    """429 ``queue_wait_exceeded``: the estimate (or the wait so far) is past the deadline."""
    eta = eta_s if eta_s is not None and math.isfinite(eta_s) else deadline
    message = (
        f"the estimated queue wait ({eta * 1000:.0f} ms) exceeds this request's deadline "
        f"({deadline * 1000:.0f} ms)"
    )
    headers = [
        (b"retry-after", b"%d" % retry_after(eta)),
        (QUEUE_ETA_HEADER, b"%d" % math.ceil(eta * 1000)),
    ]
    return HttpError("queue_wait_exceeded", message, headers=headers)


def with_retry_after(err: HttpError, drain_s: float | None) -> HttpError:
    """A capacity refusal whose ``Retry-After`` is when the queue will have drained."""
    if err.code in CAPACITY_CODES:
        return HttpError(
            err.code, err.message, err.param, [(b"retry-after", b"%d" % retry_after(drain_s))]
        )
    return err


CAPACITY_CODES = frozenset({"queue_full", "queue_timeout", "no_available_provider"})


EVENTS_HEADER = b"x-iop-queue-events"
FIRST_EVENT_S = 0.05  # admitted sooner: no queue event, the stream starts as usual
EVENT_EVERY_S = 1.0


def wants_events(stream: bool, headers: Mapping[bytes, bytes] | None) -> bool:
    """R-QUEUE-4: a streaming request that asked (``x-iop-queue-events: 1``); ignored on a
    request that does not stream."""
    return stream and headers is not None and headers.get(EVENTS_HEADER, b"").strip() == b"1"


def queue_event(position: int | None, eta_s: float | None) -> bytes:
    """One SSE comment line while waiting (the SDKs' decoders skip comments)."""
    parts = [b": queued"]
    if position:
        parts.append(b"position=%d" % position)
    if eta_s is not None and math.isfinite(eta_s):
        parts.append(b"eta_ms=%d" % max(0, math.ceil(eta_s * 1000)))
    return b" ".join(parts) + b"\n\n"


async def admitted_with_events(
    admit: Callable[[Callable[[Callable[[], int | None]], None]], Awaitable[Lease]],
    ex: Exchange,
    release: Callable[[Lease], object],
    eta_s: float | None,
) -> Lease:
    """Admission that tells a waiting streaming client where it stands (R-QUEUE-4): once it
    has waited ``FIRST_EVENT_S`` the stream opens (its headers carry the wait so far) and a
    comment goes out about once a second with its position (when the engine tells it) and
    the estimate left; ``: admitted wait_ms=N`` when it is admitted. Cancelled (client gone,
    deadline passed), the admission is withdrawn and a lease granted meanwhile released."""
    where: list[Callable[[], int | None]] = []
    began = time.monotonic()
    task = asyncio.ensure_future(admit(where.append))
    evented = False
    try:
        timeout = FIRST_EVENT_S
        while not task.done():
            await asyncio.wait({task}, timeout=timeout)
            if task.done():
                break
            timeout, evented = EVENT_EVERY_S, True
            waited = time.monotonic() - began
            ex.queue_wait_ms = int(waited * 1000)
            await ex.open_stream()
            left = None if eta_s is None else eta_s - waited
            await ex.chunk(queue_event(where[0]() if where else None, left), more=True)
        lease = task.result()
    except BaseException:
        if not task.done():
            task.cancel()
        elif not task.cancelled() and task.exception() is None:
            release(task.result())  # granted as the wait ended otherwise: never leaked
        raise
    if evented:
        wait_ms = int((time.monotonic() - began) * 1000)
        await ex.chunk(b": admitted wait_ms=%d\n\n" % wait_ms, more=True)
    return lease
