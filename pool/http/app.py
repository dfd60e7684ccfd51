"""``OpenAIApp``: the OpenAI-compatible ASGI app on ``openai.listen``.

The hot path (docs/architecture.md). Per request: one snapshot identity check, header dict,
auth by digest, bounded body, one JSON parse, one pool decision, one frame to the Node, then
relay; one meter record at the end. No ORM (managed mode reads its in-memory route table,
R-MGD-12), no Django, no logging except for a failure of the Edge itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from functools import partial
from typing import TYPE_CHECKING, Any

from catalog.config import EdgeSnapshot
from obskit.context import TRACE_ID
from pool.http import observe
from pool.http.admission import Admission, Arrival
from pool.http.auth import Caller
from pool.http.body import ClientGone, read_body
from pool.http.budgets import Budgets
from pool.http.dispatch import dispatch
from pool.http.errors import HttpError, model_not_found
from pool.http.fallback import Served, chain_of, serve
from pool.http.limits import TokenLimiter
from pool.http.managed import Grant, RouteCredentials
from pool.http.metrics import metrics_response, scrape_allowed
from pool.http.operations import ENDPOINTS, Endpoint, ParsedRequest, Target, parse_request
from pool.http.output_cap import capped
from pool.http.plane import DataPlane
from pool.http.relay import CLIENT_GONE, WRITE_FLOW, DisconnectWatch, Exchange
from pool.http.spent import tokens_of
from pool.http.tables import Tables
from pool.metering import RequestRecord

if TYPE_CHECKING:
    from obskit.otel import Tracing
    from pool.http.limits_shared import SharedTokenLimiter  # scale-out only: loads redis

log = logging.getLogger("iop.http")
access = logging.getLogger("iop.access")  # one line per request when IOP_ACCESS_LOG is on

MODELS_PATH = "/v1/models"
# For a load balancer in front of several Edges (docs/scale-out.md): no authentication, no
# detail beyond one word; 503 while this Edge stops or cannot reach its shared pool.
HEALTH_PATH = "/healthz"
MODELS_PREFIX = "/v1/models/"


class OpenAIApp:
    """Serves /v1/* (and /metrics with a scrape token) through the provider pool."""

    def __init__(
        self,
        runtime: DataPlane,
        *,
        rate_window_s: float = 60.0,
        tracing: Tracing | None = None,
        shared_limits: SharedTokenLimiter | None = None,
    ) -> None:
        self.runtime = runtime
        self.tracing = tracing  # R-OBS-2: None unless OTEL_* asked for traces
        self._snapshot: EdgeSnapshot | None = None
        self._tables: Tables | None = None
        self.limiter = TokenLimiter(rate_window_s)  # R-PRIN-2: per-token counters, this Edge
        self.shared_limits = shared_limits  # R-SCALE-6: scale-out counts in Redis instead
        self.budgets = Budgets(runtime.meter.budgets)  # R-BUD-1: from the meter's view
        self.admission = Admission(self.limiter, shared_limits, self.budgets)  # R-LIM-1

    def tables(self) -> Tables:
        """The lookup tables of the active snapshot, rebuilt when it is swapped."""
        snapshot = self.runtime.snapshot
        if snapshot is not self._snapshot or self._tables is None:
            self._tables = Tables(snapshot, self.runtime.started_at, self.runtime.managed_keys)
            self._snapshot = snapshot
            self.runtime.meter.configure_budgets(self.admission.configure(snapshot))
        return self._tables

    def target(self, model: str, provider_id: str) -> Target | None:
        return self.tables().target(model, provider_id)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if path == "/metrics":
            await self._metrics(scope, send)
            return
        if path == HEALTH_PATH:
            await self._health(scope, send)
            return
        headers = dict(scope["headers"])
        endpoint = ENDPOINTS.get(path)
        models = endpoint is None and (path == MODELS_PATH or path.startswith(MODELS_PREFIX))
        anthropic = (
            endpoint.anthropic
            if endpoint is not None
            else (models and b"anthropic-version" in headers)
        )
        meta = _Meta(endpoint.operation if endpoint else ("models" if models else "unknown"))
        meta.obs = obs = observe.begin(headers, self.tracing, meta.operation)  # R-OBS-1, R-OBS-2
        flow = scope.get("extensions", {}).get(WRITE_FLOW)
        ex = Exchange(observe.answering(send, obs), anthropic, flow)
        started = obs.started
        try:
            tables = self.tables()
            if endpoint is None and not models:
                raise HttpError("not_found", f"no route for {scope['method']} {path[:200]}")
            if tables.managed is not None:  # R-AUTH-5: a route key, bound before admission
                meta.grant = tables.managed.authenticate(headers, anthropic)
                caller = meta.grant.caller
            else:
                caller = tables.auth.authenticate(headers, anthropic)
            meta.principal_ref, meta.token_ref = caller.principal_ref, caller.token_ref
            if endpoint is None:
                await self._models(scope["method"], path, tables, ex, caller)
            else:
                await self._post(scope, receive, headers, endpoint, tables, ex, meta, caller)
        except HttpError as err:
            await ex.fail(err)
        except ClientGone:
            ex.client_gone()
        except Exception:  # a bug of the Edge itself: a JSON 500, never a page or a trace
            log.exception("request to %s failed inside the Edge", path[:200])
            await ex.fail(HttpError("internal_error"))
        finally:
            self._end(meta, ex, time.perf_counter() - started)

    async def _post(
        self,
        scope: dict[str, Any],
        receive: Any,
        headers: dict[bytes, bytes],
        endpoint: Endpoint,
        tables: Tables,
        ex: Exchange,
        meta: _Meta,
        caller: Caller,
    ) -> None:
        if scope["method"] != "POST":
            raise HttpError("method_not_allowed", f"{scope['path']} accepts POST only")
        if self.runtime.draining:  # stopping: the running requests finish, no new one starts
            raise HttpError("no_available_provider", "the Edge is shutting down")
        forward = tables.provider_auth.forward_headers(headers)
        meta.arrival = self.admission.arrive(caller)  # R-LIM-1: counted from the headers on
        ex.extra_headers = meta.arrival.headers
        body = await read_body(receive, headers.get(b"content-length"), tables.max_request_bytes)
        request = parse_request(endpoint, body)
        request.headers = headers
        meta.request = request
        if not caller.may_use(request.model):  # R-PRIN-1: the answer an unknown group gets
            raise model_not_found(request.model)
        if request.model in tables.snapshot.models:
            meta.model_group = request.model
        # R-LIM-1: the one admission decision, after the body (across Edges: R-SCALE-6); a
        # refusal carries the x-budget-* of this moment
        ex.extra_headers = []
        ex.extra_headers = await self.admission.decide(
            caller, meta.arrival, request.input_tokens_estimate
        )
        credentials = None
        if tables.managed is not None and meta.grant is not None:
            credentials = RouteCredentials(tables.managed, meta.grant, request.model)
        groups = chain_of(tables, request, caller, credentials is not None)  # R-FALL-1
        meta.served = Served(request.model)
        owner, max_queued = self.admission.queue_share(caller)  # R-PRIN-3, R-MGD-13
        # a partial, not a closure: one object, not seven cells, kept while the request runs
        run = partial(self._dispatch, tables, forward, ex, owner, max_queued, credentials)
        watch = DisconnectWatch(receive, ex, scope.get("extensions", {}).get(CLIENT_GONE))
        try:
            await serve(tables, request, groups, ex, meta.served, run)
        except asyncio.CancelledError:
            if not watch.absorb():
                raise
            ex.client_gone()  # lease released and run cancelled on the way out of dispatch
        finally:
            watch.stop()

    def _dispatch(
        self,
        tables: Tables,
        forward: tuple[tuple[str, str], ...],
        ex: Exchange,
        owner: str | None,
        max_queued: int | None,
        credentials: RouteCredentials | None,
        attempt: ParsedRequest,
        long: bool,
    ) -> Awaitable[None]:
        """One attempt of the request on one model group (``serve`` calls it per group)."""
        group = tables.snapshot.models.get(attempt.model)
        return dispatch(
            self.runtime,
            capped(attempt, group.max_output_tokens if group else None),  # R-LIM-5
            long=long,
            window=tables.stream_buffer_bytes,
            forward_headers=forward,
            target_of=self.target,
            ex=ex,
            owner=owner,
            max_queued=max_queued,
            credentials=credentials,
        )

    async def _models(
        self, method: str, path: str, tables: Tables, ex: Exchange, caller: Caller
    ) -> None:
        if method != "GET":
            raise HttpError("method_not_allowed", f"{path} accepts GET only")
        if path == MODELS_PATH:
            await ex.respond(200, tables.models_list(caller.models))  # R-PRIN-1
            return
        model = path[len(MODELS_PREFIX) :]
        body = tables.model_bodies.get(model)
        if body is None or not caller.may_use(model):
            raise model_not_found(model)
        await ex.respond(200, body)

    async def _health(self, scope: dict[str, Any], send: Any) -> None:
        """200 ``{"status":"ok"}`` while this Edge takes new requests, else 503 with why."""
        if scope["method"] not in ("GET", "HEAD"):
            status, word = 405, "method_not_allowed"
        elif self.runtime.draining:
            status, word = 503, "draining"
        elif not self.runtime.pool.reachable:
            status, word = 503, "pool_unavailable"
        else:
            status, word = 200, "ok"
        body = b'{"status":"%s"}' % word.encode()
        headers = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send(
            {"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body}
        )

    async def _metrics(self, scope: dict[str, Any], send: Any) -> None:
        """The Prometheus scrape, only with the configured ``openai.metrics_token``."""
        ex = Exchange(send, False)
        if self.runtime.snapshot.metrics_token is None:
            await ex.fail(HttpError("not_found"))
        elif scope["method"] != "GET":
            await ex.fail(HttpError("method_not_allowed"))
        elif not scrape_allowed(self.runtime, scope["headers"]):
            await ex.fail(HttpError("invalid_api_key"))
        else:
            await metrics_response(self.runtime, send)

    def _end(self, meta: _Meta, ex: Exchange, duration_s: float) -> None:
        """The request ended however it ended: its limiter charge is settled, then metered."""
        input_tokens, output_tokens, estimated = _usage(meta, ex)
        spent = input_tokens + output_tokens + sum(s.total for s in ex.spent)  # R-BUD-2
        if meta.arrival is not None:  # R-PRIN-2: exactly once, the estimate corrected
            self.admission.finish(meta.arrival, spent)
        request = meta.request
        status = ex.status or 500
        meter = self.runtime.meter
        group, asked = meta.model_group, ""
        served = meta.served
        if group and served is not None and served.group != served.asked:  # R-FALL-1
            group, asked = served.group, served.asked
        stream = ex.stream or (request is not None and request.stream)
        obs = meta.obs
        assert obs is not None
        ttft = observe.ttft_s(obs, stream, status)
        node_id = self._observed(meta, ex, status, input_tokens, output_tokens, duration_s)
        record = RequestRecord(
            operation=meta.operation,
            model_group=group,
            requested_group=asked,
            provider_id=ex.provider_id,
            principal_ref=meta.principal_ref,
            token_ref=meta.token_ref,
            status=status,
            code=ex.code,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cached_input_tokens=ex.usage.cached_input_tokens if ex.usage is not None else 0,
            estimated=estimated,
            duration_s=duration_s,
            stream=stream,
            request_id=obs.request_id,
            trace_id=TRACE_ID.get(),
            node_id=node_id,
            queue_wait_s=obs.queue_wait_s,
            ttft_s=ttft,
        )
        for attempt in ex.spent:  # R-BUD-2: discarded attempts, tokens only
            meter.record(attempt.record_of(record))
        meter.record(record)

    def _observed(
        self, meta: _Meta, ex: Exchange, status: int, tokens_in: int, tokens_out: int, took: float
    ) -> str | None:
        """The request's span ended with its GenAI attributes, its access line (when on);
        returns the Node its provider is on."""
        obs = meta.obs
        assert obs is not None
        provider_id = ex.provider_id
        spec = self.runtime.snapshot.providers.get(provider_id) if provider_id else None
        node_id = spec.node_id if spec is not None else None
        code = ex.code if (status >= 400 or ex.code) else None
        if obs.span is not None:
            request = meta.request
            # R-FALL-1: the served model is the serving group's mapping (a fallback's too)
            group = meta.served.group if meta.served is not None else request and request.model
            target = self.target(group, provider_id) if group and provider_id else None
            observe.finish(
                obs, code, operation=meta.operation,
                request_model=request.model[:200] if request else None,
                response_model=target.model if target else None,
                input_tokens=tokens_in, output_tokens=tokens_out, provider=provider_id,
                node=node_id, principal=meta.principal_ref, status=status,
            )  # fmt: skip
        if access.isEnabledFor(logging.INFO):
            access.info(
                "%s %s %d %s %.1f ms provider=%s tokens=%d/%d",
                meta.operation, meta.model_group or "-", status, code or "ok", took * 1000,
                provider_id or "-", tokens_in, tokens_out,
            )  # fmt: skip
        return node_id


def _usage(meta: _Meta, ex: Exchange) -> tuple[int, int, bool]:
    """(input tokens, output tokens, estimated) of a finished request (its cached input
    tokens are ``ex.usage``'s, R-COST-1: none without the upstream's usage)."""
    usage = ex.usage
    if usage is not None:
        return usage.input_tokens, usage.output_tokens, usage.estimated
    request = meta.request
    reached = ex.provider_id is not None and ex.reached  # a refused connection used nothing
    if request is not None and reached and meta.operation != "count_tokens":
        # No usage from the upstream: the documented estimates, marked as such.
        return request.input_tokens_estimate, tokens_of(ex.relayed_chars), True
    return 0, 0, False


class _Meta:
    """Who and what a request was, for its one meter record."""

    __slots__ = (
        "arrival",
        "grant",
        "model_group",
        "obs",
        "operation",
        "principal_ref",
        "request",
        "served",
        "token_ref",
    )

    def __init__(self, operation: str) -> None:
        self.operation = operation
        self.model_group = ""  # only a configured group id: caller text never becomes a label
        self.principal_ref: str | None = None
        self.token_ref: str | None = None
        self.request: ParsedRequest | None = None
        self.arrival: Arrival | None = None  # the limiters' counts, given back once at the end
        self.grant: Grant | None = None
        self.served: Served | None = None  # R-FALL-1: the group asked of, the one serving
        self.obs: observe.Observation | None = None
