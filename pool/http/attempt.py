"""A request's hold on the pool: its lease and run (R-POOL-9), and how a run is started.

``Attempt`` owns the lease and run a request holds now; a gate recovery (R-SEG-6) gives them
back and takes new ones in the same object, so ``dispatch`` releases whatever is held at the
end, exactly once.
"""

from __future__ import annotations

from collections.abc import Callable

from nodes.runs import RunChannel, RunOrder
from pool.engine import Lease
from pool.http import observe
from pool.http.errors import HttpError
from pool.http.managed import RouteCredentials
from pool.http.operations import ParsedRequest, Target, client_headers, upstream_body
from pool.http.plane import DataPlane
from pool.http.relay import Exchange, RunSource
from pool.translate.channel import TranslatedChannel
from pool.translate.common import TranslationError
from pool.translate.fields import metric_label
from pool.translate.plan import route
from pool.translate.select import Translation, translation

TargetOf = Callable[[str, str], Target | None]


class Attempt:
    """The lease and run a request holds now; each is given back exactly once (R-POOL-9)."""

    __slots__ = ("channel", "credentials", "lease", "runtime", "window")

    def __init__(
        self,
        runtime: DataPlane,
        lease: Lease,
        window: int,
        credentials: RouteCredentials | None = None,
    ) -> None:
        self.runtime = runtime
        self.lease: Lease | None = lease
        self.window = window  # R-IN-5: output the Node may send ahead of the client
        self.channel: RunChannel | None = None
        self.credentials = credentials  # managed mode: seals each run's envelope (R-MGD-4)

    def close(self) -> None:
        """Cancel the run (if still going) and release the lease; safe to call again."""
        channel, self.channel = self.channel, None
        lease, self.lease = self.lease, None
        if channel is not None:
            self.runtime.hub.close_run(channel)
        if lease is not None:
            self.runtime.pool.release(lease)


async def open_attempt(
    attempt: Attempt,
    request: ParsedRequest,
    forward_headers: tuple[tuple[str, str], ...],
    target_of: TargetOf,
    ex: Exchange,
) -> tuple[RunSource, Target] | None:
    """Start ``request`` on the attempt's lease; None when it was answered here. Raises
    ``NodeUnavailable`` when the lease's Node is gone (a retry may take it elsewhere)."""
    lease = attempt.lease
    assert lease is not None
    target = target_of(request.model, lease.provider_id)
    if target is None:  # the mapping went away in a refresh between admission and here
        ex.provider_id = lease.provider_id
        raise HttpError("no_available_provider")
    xlate = translation_for(request, target) if target.translate else None
    ex.provider_id = lease.provider_id  # after a refusal to translate: nothing was used
    if xlate is not None:
        dropped(attempt.runtime, ex, xlate.dropped)
    elif target.client_headers and target.tunnel:  # R-XLATE-6: the native API's own headers
        forward_headers = forward_headers + client_headers(target, request.headers)
    if xlate is not None and xlate.answer is not None:  # answered here: nothing to run
        await ex.respond(200, xlate.answer.encode())
        return None
    request_id, traceparent = observe.run_ids()  # R-OBS-1, R-OBS-2: they travel with the run
    spec = RunOrder(
        tunnel=target.tunnel,
        operation=request.endpoint.operation if xlate is None else xlate.operation,
        stream=request.stream,
        body=upstream_body(request, target) if xlate is None else xlate.body,
        # R-AUTH-2: a forwarded credential goes to OpenAI-compatible providers only.
        forward_headers=forward_headers if target.tunnel else (),
        seal=(
            attempt.credentials.sealer(lease.provider_id)
            if attempt.credentials is not None
            else None
        ),
        grant=(  # a Node on another Edge: that Edge issues the envelope (R-SCALE-7)
            attempt.credentials.slot_grant(lease.provider_id)
            if attempt.credentials is not None
            else None
        ),
        request_id=request_id,
        traceparent=traceparent,
    )
    # may raise NodeUnavailable
    attempt.channel = await attempt.runtime.hub.open_run(lease, spec, attempt.window)
    observe.running(attempt.channel.run_id, lease.node_id, lease.provider_id)
    source: RunSource = attempt.channel
    ex.in_band_failure = None if xlate is None or xlate.stream is None else xlate.stream.failed
    if xlate is not None:
        source = TranslatedChannel(attempt.channel, stream=xlate.stream, whole=xlate.whole)
    return source, target


DROPPED_HEADER = b"x-iop-dropped"


def dropped(runtime: DataPlane, ex: Exchange, names: tuple[str, ...]) -> None:
    """R-XLATE-5: what this attempt's translation left out, on the answer and in /metrics
    (an attempt after a retry or fallback replaces an earlier attempt's header)."""
    headers = [h for h in ex.extra_headers if h[0] != DROPPED_HEADER]
    if names:
        headers.append((DROPPED_HEADER, ",".join(names).encode()))
        runtime.meter.translation_dropped(metric_label(name) for name in names)
    ex.extra_headers = headers


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
            thinking=target.thinking,
            refuse_dropped=target.refuse_dropped,
        )
    except TranslationError as exc:
        raise HttpError(exc.code, exc.message, exc.param) from None
