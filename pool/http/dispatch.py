"""One admitted request's life: lease -> run on the Node -> relay -> release (R-POOL-9).

The lease is released in ``finally``, synchronously and exactly once, whatever ends the
attempt: success, an upstream error, a Node going away, or the client disconnecting (the
request task is then cancelled, while queued or while running; docs/architecture.md:
leases and cancellation). A run still going on its Node is cancelled there by ``hub.close_run``.

R-HEALTH-1: an attempt that failed before anything reached the client releases its lease,
tells the pool how its provider did, and re-enters admission without the providers that
already failed this request, within the request's original queue deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from nodes.hub import NodeUnavailable
from nodes.runs import RunChannel, RunOrder
from pool.engine import Lease, ProviderPool
from pool.engine.errors import PoolError
from pool.http.errors import HttpError, RunFailed, from_pool_error
from pool.http.failover import (
    ANSWERED,
    FAILURE,
    NODE_NOT_CONNECTED,
    SUCCESS,
    UNKNOWN,
    Verdict,
    verdict_of,
)
from pool.http.operations import ParsedRequest, Target, upstream_body
from pool.http.plane import DataPlane
from pool.http.relay import Exchange, RunSource, relay_stream, relay_whole
from pool.translate.channel import TranslatedChannel
from pool.translate.common import TranslationError
from pool.translate.plan import route
from pool.translate.select import Translation, translation

TargetOf = Callable[[str, str], Target | None]


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
) -> None:
    """Admit ``request`` to the pool, run it on the leased provider and relay the answer.

    ``owner`` (the caller's token) holds at most ``max_queued`` waiters (R-PRIN-3), a retry
    too; the Node holds output past ``window`` characters not yet relayed (R-IN-5).
    """
    pool: ProviderPool = runtime.pool
    snapshot = runtime.snapshot
    retries = snapshot.retry_before_first_byte
    loop = asyncio.get_running_loop()
    deadline = loop.time() + snapshot.queue_timeout_ms / 1000 if snapshot.queue_timeout_ms else None
    excluded: frozenset[str] = frozenset()
    try:
        lease = await pool.acquire(
            request.model, request.needs, long=long, owner=owner, max_queued=max_queued
        )
    except PoolError as exc:
        raise from_pool_error(exc) from None
    while True:
        failed, verdict = await _attempt(
            runtime, lease, request, forward_headers, target_of, ex, window
        )
        if failed is None:
            return
        ex.reached = verdict.reached
        if not verdict.retry or retries == 0 or ex.started:
            raise failed
        retries -= 1
        excluded |= {lease.provider_id}
        runtime.health.retried(request.model, lease.provider_id)
        left = None if deadline is None else deadline - loop.time()
        if left is not None and left <= 0:
            raise failed
        try:
            async with asyncio.timeout(left):
                lease = await pool.acquire(
                    request.model,
                    request.needs,
                    long=long,
                    owner=owner,
                    max_queued=max_queued,
                    exclude=excluded,
                )
        except (PoolError, TimeoutError):
            raise failed from None  # nothing else can take it in time: the failure stands


async def _attempt(
    runtime: DataPlane,
    lease: Lease,
    request: ParsedRequest,
    forward_headers: tuple[tuple[str, str], ...],
    target_of: TargetOf,
    ex: Exchange,
    window: int,
) -> tuple[RunFailed | None, Verdict]:
    """Run once on ``lease``; the failure (not raised) when another provider may try."""
    pool: ProviderPool = runtime.pool
    channel: RunChannel | None = None
    verdict = UNKNOWN
    try:
        ex.reached = True
        target = target_of(request.model, lease.provider_id)
        if target is None:  # the mapping went away in a refresh between admission and here
            ex.provider_id = lease.provider_id
            raise HttpError("no_available_provider")
        xlate = translation_for(request, target) if target.translate else None
        ex.provider_id = lease.provider_id  # after a refusal to translate: nothing was used
        if xlate is not None and xlate.answer is not None:  # answered here: nothing to run
            await ex.respond(200, xlate.answer.encode())
            return None, verdict
        spec = RunOrder(
            tunnel=target.tunnel,
            operation=request.endpoint.operation if xlate is None else xlate.operation,
            stream=request.stream,
            body=upstream_body(request, target) if xlate is None else xlate.body,
            # R-AUTH-2: a forwarded credential goes to OpenAI-compatible providers only.
            forward_headers=forward_headers if target.tunnel else (),
        )
        try:
            channel = await runtime.hub.open_run(lease, spec, window)
        except NodeUnavailable:
            verdict = NODE_NOT_CONNECTED
            message = "the provider's node is not connected"
            return RunFailed("no_available_provider", message, None), verdict
        source: RunSource = channel
        if xlate is not None:
            source = TranslatedChannel(channel, stream=xlate.stream, whole=xlate.whole)
        try:
            if request.stream:
                end = await relay_stream(source, ex, silence_s=target.silence_s)
            else:
                end = await relay_whole(source, ex, silence_s=target.silence_s)
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
        if channel is not None:
            runtime.hub.close_run(channel)
        if verdict.health == SUCCESS:
            pool.succeeded(lease)
        elif verdict.health == FAILURE:
            pool.failed(lease, verdict.reason, verdict.retry_after_s)
        pool.release(lease)


def translation_for(request: ParsedRequest, target: Target) -> Translation | None:
    """R-XLATE-1: the translation ``request`` takes on the target's provider, None when the
    provider speaks its operation natively; R-XLATE-2: 400 for what cannot be translated."""
    kind = route(request.endpoint.operation, target.capabilities)
    if kind is None:
        return None
    try:
        return translation(
            kind,
            request.data,
            target.model,
            stream=request.stream,
            input_estimate=request.input_tokens_estimate,
            driver=target.driver,
        )
    except TranslationError as exc:
        raise HttpError(exc.code, exc.message, exc.param) from None
