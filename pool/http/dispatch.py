"""One admitted request's life: lease -> run on the Node -> relay -> release (R-POOL-9).

The lease is released in ``finally``, synchronously and exactly once, whatever ends the
attempt: success, an upstream error, a Node going away, or the client disconnecting (the
request task is then cancelled, while queued or while running; docs/architecture.md:
leases and cancellation). A run still going on its Node is cancelled there by ``hub.close_run``.

R-HEALTH-1: an attempt that failed before anything reached the client releases its lease,
tells the pool how its provider did, and re-enters admission without the providers that
already failed this request, within the request's original queue deadline.

R-SEG-5: with the Stream Evidence Gate on, a streamed Chat Completion is relayed through it
(``pool.http.gated``); its recoveries swap the lease and run inside the attempt's ``Attempt``
and re-enter admission the same way, within the same deadline.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from functools import partial

from nodes.hub import NodeUnavailable
from pool.engine import Lease, PoolEngine
from pool.engine.core import NO_EXCLUSION
from pool.engine.errors import PoolError
from pool.http import observe
from pool.http.affinity import affinity_of
from pool.http.attempt import Attempt, TargetOf, open_attempt
from pool.http.errors import RunFailed, from_pool_error
from pool.http.failover import (
    ANSWERED,
    FAILURE,
    NODE_NOT_CONNECTED,
    SUCCESS,
    UNKNOWN,
    Verdict,
    verdict_of,
)
from pool.http.gated import Admit, gated_source
from pool.http.managed import RouteCredentials
from pool.http.naming import ModelNames
from pool.http.operations import ParsedRequest
from pool.http.plane import DataPlane
from pool.http.queueing import (
    admitted_with_events,
    deadline_s,
    wait_exceeded,
    wants_events,
    with_retry_after,
)
from pool.http.relay import Exchange, relay_stream, relay_whole

OnQueued = Callable[[Callable[[], int | None]], None]

# LOG_LEVEL=DEBUG: each admission decision (docs/configuration.md); ids only, never a secret.
log = logging.getLogger("iop.pool")


def _admit(
    pool: PoolEngine,
    request: ParsedRequest,
    long: bool,
    owner: str | None,
    max_queued: int | None,
    off_route: frozenset[str],
    affinity: tuple[str, float] | None,
    exclude: frozenset[str] = NO_EXCLUSION,
    on_queued: OnQueued | None = None,
) -> Awaitable[Lease]:
    """Admission to the pool for ``request`` (``dispatch`` binds all but the last two)."""
    return pool.acquire(
        request.model,
        request.needs,
        long=long,
        owner=owner,
        max_queued=max_queued,
        exclude=exclude | off_route if off_route else exclude,
        on_queued=on_queued,
        affinity=affinity,  # R-AFF-1
    )


def _admitted(request: ParsedRequest, lease: Lease, left_out: frozenset[str]) -> None:
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "admitted: model group %s -> provider %s on node %s (left out: %s)",
            request.model, lease.provider_id, lease.node_id, ", ".join(sorted(left_out)) or "none",
        )  # fmt: skip


def _refused(request: ParsedRequest, error: BaseException) -> None:
    if log.isEnabledFor(logging.DEBUG):
        code = getattr(error, "code", type(error).__name__)
        log.debug("not admitted: model group %s: %s", request.model, code)


async def dispatch(
    runtime: DataPlane,
    request: ParsedRequest,
    *,
    long: bool,
    window: int,
    forward_headers: tuple[tuple[str, str], ...],
    target_of: TargetOf,
    ex: Exchange,
    owner: str | None = None,
    max_queued: int | None = None,
    credentials: RouteCredentials | None = None,
) -> None:
    """Admit ``request`` to the pool, run it on the leased provider and relay the answer.

    ``owner`` (the caller's token) holds at most ``max_queued`` waiters (R-PRIN-3), a retry
    and a gate recovery too; the Node holds output past ``window`` characters not yet relayed
    (R-IN-5). In managed mode ``credentials`` keeps every admission (first, retry, gate
    recovery) to the route's providers and issues each run's lease envelope (R-MGD-3, R-MGD-4).
    """
    pool: PoolEngine = runtime.pool
    snapshot = runtime.snapshot
    retries = snapshot.retry_before_first_byte
    loop = asyncio.get_running_loop()
    deadline = loop.time() + snapshot.queue_timeout_ms / 1000 if snapshot.queue_timeout_ms else None
    # one shared empty set, not a new one per request (a held stream keeps them)
    excluded = NO_EXCLUSION
    off_route = credentials.excluded if credentials is not None else NO_EXCLUSION
    group = snapshot.models.get(request.model)
    affinity = affinity_of(request.model, group.affinity if group else None, request.data)
    # a partial, not a closure: one object, not seven cells, kept while the request runs
    admit = partial(_admit, pool, request, long, owner, max_queued, off_route, affinity)
    lease = await _first_admission(runtime, request, long, admit, ex)
    _admitted(request, lease, off_route)
    gate = (admit, deadline) if request.stream and snapshot.stream_evidence_gate.enabled else None
    while True:
        attempt = Attempt(runtime, lease, window, credentials)
        failed, verdict = await _attempt(attempt, request, forward_headers, target_of, ex, gate)
        if failed is None:
            return
        ex.reached = verdict.reached
        if not verdict.retry or retries == 0 or ex.started:
            raise failed
        retries -= 1
        failed_on = ex.provider_id or lease.provider_id  # after a gate recovery: the last one
        excluded |= {failed_on}
        runtime.health.retried(request.model, failed_on)
        left = None if deadline is None else deadline - loop.time()
        if left is not None and left <= 0:
            raise failed
        try:
            async with asyncio.timeout(left):
                with observe.admission():
                    lease = await admit(excluded)
        except (PoolError, TimeoutError) as exc:
            _refused(request, exc)
            raise failed from None  # nothing else can take it in time: the failure stands
        _admitted(request, lease, excluded | off_route)


async def _first_admission(
    runtime: DataPlane,
    request: ParsedRequest,
    long: bool,
    admit: Callable[[frozenset[str], OnQueued | None], Awaitable[Lease]],
    ex: Exchange,
) -> Lease:
    """The request's first lease, within the deadline it states (R-QUEUE-2): refused at once
    when the estimate exceeds it, else the waiter leaves the queue when it passes (its
    ``acquire`` is cancelled, as when a client goes away). R-QUEUE-1: the wait goes on the
    answer; a capacity refusal's ``Retry-After`` is the queue's drain time."""
    pool = runtime.pool
    deadline = deadline_s(request.headers)
    eta = pool.estimate_wait(request.model, request.needs, long)
    if deadline is not None and eta is not None and eta > deadline:
        refusal = wait_exceeded(eta, deadline)
        _refused(request, refusal)
        raise refusal
    began = time.monotonic()
    waited: asyncio.Timeout | None = None  # no deadline: no timer (2.7 µs per request)
    try:
        with observe.admission():  # R-OBS-3: the queue wait
            if deadline is None:
                lease = await _first_lease(request, eta, admit, ex, pool.release)
            else:
                async with asyncio.timeout(deadline) as waited:
                    lease = await _first_lease(request, eta, admit, ex, pool.release)
    except PoolError as exc:
        _refused(request, exc)
        err = from_pool_error(exc, request.model, request.needs)
        raise with_retry_after(err, pool.drain_s()) from None
    except TimeoutError as exc:
        if waited is None or not waited.expired():
            raise
        _refused(request, exc)
        assert deadline is not None
        eta = pool.estimate_wait(request.model, request.needs, long)
        raise wait_exceeded(eta, deadline) from None
    finally:
        if not ex.started:  # a stream opened for queue events already said its wait
            ex.queue_wait_ms = int((time.monotonic() - began) * 1000)
    if eta:  # it queued with an estimate: how far off it was (R-QUEUE-3)
        runtime.meter.queue_estimate(eta, (time.monotonic() - began))
        if not ex.started:
            ex.queue_eta_ms = math.ceil(eta * 1000)
    return lease


def _first_lease(
    request: ParsedRequest,
    eta: float | None,
    admit: Callable[[frozenset[str], OnQueued | None], Awaitable[Lease]],
    ex: Exchange,
    release: Callable[[Lease], object],
) -> Awaitable[Lease]:
    """The admission itself; a request that asked hears queue events while it waits
    (R-QUEUE-4)."""
    if eta != 0 and wants_events(request.stream, request.headers):
        return admitted_with_events(lambda queued: admit(NO_EXCLUSION, queued), ex, release, eta)
    return admit(NO_EXCLUSION, None)


async def _attempt(
    attempt: Attempt,
    request: ParsedRequest,
    forward_headers: tuple[tuple[str, str], ...],
    target_of: TargetOf,
    ex: Exchange,
    gate: tuple[Admit, float | None] | None,
) -> tuple[RunFailed | None, Verdict]:
    """Run once on the attempt's lease; the failure (not raised) when another provider may
    try. The health verdict goes to the provider that ran last (after a gate recovery, the
    one that answered)."""
    runtime = attempt.runtime
    verdict = UNKNOWN
    try:
        ex.reached = True
        try:
            opened = await open_attempt(attempt, request, forward_headers, target_of, ex)
        except NodeUnavailable as gone:  # scale-out: Redis away while routing, R-SCALE-2
            verdict = NODE_NOT_CONNECTED
            return RunFailed(gone.code, gone.public_message, None), verdict
        if opened is None:  # answered here: nothing to run
            return None, verdict
        source, target = opened
        names = ModelNames(request.name)  # the name the client asked for (docs/http-api.md)
        try:
            if not request.stream:
                end = await relay_whole(source, ex, silence_s=target.silence_s, names=names)
            else:
                if gate is not None:
                    source = gated_source(
                        source, attempt, request, forward_headers, target_of, ex, *gate
                    )
                end = await relay_stream(source, ex, silence_s=target.silence_s, names=names)
        except RunFailed as failed:
            verdict = verdict_of(failed.error)
            return failed, verdict
        except asyncio.CancelledError:
            if ex.output_bytes:  # the caller left after the upstream had answered
                verdict = ANSWERED
            raise
        verdict = ANSWERED if end.ok else UNKNOWN  # after the first byte: not a health signal
        return None, verdict
    finally:
        lease = attempt.lease
        if lease is not None:
            if verdict.health == SUCCESS:
                runtime.pool.succeeded(lease)
            elif verdict.health == FAILURE:
                runtime.pool.failed(lease, verdict.reason, verdict.retry_after_s)
        attempt.close()
