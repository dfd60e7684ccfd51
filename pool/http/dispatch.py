"""One admitted request's life: lease -> run on the Node -> relay -> release (R-POOL-9).

The lease is released in ``finally``, synchronously and exactly once, whatever ends the
request: success, an upstream error, a Node going away, or the client disconnecting (the
request task is then cancelled, while queued or while running; docs/architecture.md:
leases and cancellation). A run still going on its Node is cancelled there by ``hub.close_run``.
"""

from __future__ import annotations

from collections.abc import Callable

from nodes.hub import NodeUnavailable
from nodes.runs import RunChannel, RunOrder
from pool.engine.errors import PoolError
from pool.http.errors import HttpError, from_pool_error
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
    forward_headers: tuple[tuple[str, str], ...],
    target_of: TargetOf,
    ex: Exchange,
    owner: str | None = None,
    max_queued: int | None = None,
) -> None:
    """Admit ``request`` to the pool, run it on the leased provider and relay the answer.

    ``owner`` (the caller's token) holds at most ``max_queued`` waiters (R-PRIN-3).
    """
    pool = runtime.pool
    try:
        lease = await pool.acquire(
            request.model, request.needs, long=long, owner=owner, max_queued=max_queued
        )
    except PoolError as exc:
        raise from_pool_error(exc) from None
    channel: RunChannel | None = None
    try:
        target = target_of(request.model, lease.provider_id)
        if target is None:  # the mapping went away in a refresh between admission and here
            ex.provider_id = lease.provider_id
            raise HttpError("no_available_provider")
        xlate = translation_for(request, target) if target.translate else None
        ex.provider_id = lease.provider_id  # after a refusal to translate: nothing was used
        if xlate is not None and xlate.answer is not None:  # answered here: nothing to run
            await ex.respond(200, xlate.answer.encode())
            return
        spec = RunOrder(
            tunnel=target.tunnel,
            operation=request.endpoint.operation if xlate is None else xlate.operation,
            stream=request.stream,
            body=upstream_body(request, target) if xlate is None else xlate.body,
            # R-AUTH-2: a forwarded credential goes to OpenAI-compatible providers only.
            forward_headers=forward_headers if target.tunnel else (),
        )
        try:
            channel = await runtime.hub.open_run(lease, spec)
        except NodeUnavailable:
            raise HttpError(
                "no_available_provider", "the provider's node is not connected"
            ) from None
        source: RunSource = channel
        if xlate is not None:
            source = TranslatedChannel(channel, stream=xlate.stream, whole=xlate.whole)
        if request.stream:
            await relay_stream(source, ex, silence_s=target.silence_s)
        else:
            await relay_whole(source, ex, silence_s=target.silence_s)
    finally:
        if channel is not None:
            runtime.hub.close_run(channel)
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
