"""The usage meter: Prometheus counters per request and batched writes to the usage ledger.

``record()`` runs at the end of every request on the event loop: label lookups, counter
increments and one dict update, no I/O. One task per meter writes the pending aggregates
to the database every few seconds through a worker thread, so the ORM never runs on the
request path (docs/architecture.md: the hot path).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from catalog.config.money import MAX_PICO, PICO
from pool.metering.budget_view import BudgetView, Counted, Reader, read_in_worker
from pool.metering.labels import (
    NO_LABEL,
    LabelIndex,
    RequestLabels,
    RequestRecord,
    Vocabulary,
    token_count,
)
from pool.metering.latency import LatencyMetrics
from pool.metering.pending import Counts, PendingUsage, UsageKey, hour_bucket
from pool.metering.request_log import (
    PendingRequests,
    request_log_retention_days,
    retention_days,
    write_rows,
)

if TYPE_CHECKING:
    from catalog.config import EdgeSnapshot

logger = logging.getLogger(__name__)

RETENTION_SETTING = "IOP_USAGE_RETENTION_DAYS"
DEFAULT_RETENTION_DAYS = 90
PRUNE_EVERY_S = 24 * 3600
MAX_OPERATIONS = 32  # distinct operation labels; the Edge has fewer than ten
MAX_CODES = 64  # distinct error-code labels
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
                    120.0, 300.0, 600.0)  # fmt: skip
# Actual minus estimated queue wait, seconds (R-QUEUE-3): negative when it was served early.
QUEUE_ERROR_BUCKETS = (-30.0, -10.0, -5.0, -2.0, -1.0, -0.5, -0.25, -0.1, 0.0, 0.1, 0.25, 0.5,
                       1.0, 2.0, 5.0, 10.0, 30.0)  # fmt: skip

Writer = Callable[[dict[UsageKey, Counts], datetime | None], int]
RowsWriter = Callable[[list[tuple[object, ...]], datetime | None], int]


def usage_retention_days() -> int:
    """Days of usage rows to keep (the ``IOP_USAGE_RETENTION_DAYS`` setting); 0 keeps all."""
    return retention_days(RETENTION_SETTING, DEFAULT_RETENTION_DAYS)


def write_rows_in_worker(rows: list[tuple[object, ...]], prune_before: datetime | None) -> int:
    """Write request-log rows from a worker thread, then close that thread's connections."""
    from django.db import connections

    try:
        return write_rows(rows, prune_before)
    finally:
        connections.close_all()


def discard_rows(rows: list[tuple[object, ...]], prune_before: datetime | None) -> int:
    return 0


def write_in_worker(batch: dict[UsageKey, Counts], prune_before: datetime | None) -> int:
    """Write a batch from a worker thread, then close that thread's connections."""
    from django.db import connections

    from pool.metering.store import write_batch

    try:
        return write_batch(batch, prune_before=prune_before)
    finally:
        connections.close_all()


_NO_ROUTES: Mapping[str, str] = {}


def _no_routes() -> Mapping[str, str]:
    return _NO_ROUTES


class UsageMeter:
    """Counts requests and tokens (R-AUTH-1, R-CFG-4) into its own registry and the ledger."""

    def __init__(
        self,
        snapshot: Callable[[], EdgeSnapshot],
        *,
        flush_interval_s: float = 5.0,
        max_pending_keys: int = 10_000,
        retention_days: int | None = None,
        writer: Writer | None = None,
        budget_reader: Reader | None = None,
        clock: Callable[[], float] = time.time,
        rows_writer: RowsWriter | None = None,
        request_retention_days: int | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._interval = flush_interval_s
        self._clock = clock
        self._writer: Writer = writer or write_in_worker
        # R-OBS-1: the request log; a meter given its own bucket writer (tests) keeps no
        # request rows unless it is given a rows writer too.
        self._rows_writer: RowsWriter = rows_writer or (
            write_rows_in_worker if writer is None else discard_rows
        )
        self._request_retention_days = (
            request_log_retention_days()
            if request_retention_days is None
            else request_retention_days
        )
        self.requests = PendingRequests()
        self._next_request_prune = 0.0
        self._retention_days = usage_retention_days() if retention_days is None else retention_days
        self.pending = PendingUsage(max_pending_keys)
        self.budgets = BudgetView()  # R-BUD-1: read after each flush, under the same lock
        self._budget_reader: Reader = budget_reader or read_in_worker
        self._operations, self._codes = Vocabulary(MAX_OPERATIONS), Vocabulary(MAX_CODES)
        self._request_cache: dict[RequestLabels, tuple[Any, Any]] = {}
        self._token_cache: dict[tuple[RequestLabels, bool], tuple[Any, Any]] = {}
        self._spend_cache: dict[tuple[RequestLabels, bool], Any] = {}
        self.registry = CollectorRegistry()
        self._index_for: EdgeSnapshot | None = None
        self._index: LabelIndex | None = None
        # R-MGD-13: managed mode's route id -> principal (the route table's, swapped whole):
        # a route key is metered as (its principal, its route), never as nobody.
        self.route_labels: Callable[[], Mapping[str, str]] = _no_routes
        self._routes_for: Mapping[str, str] | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._next_prune = 0.0  # monotonic; 0 = the first write also prunes
        self._closed = False
        self._define_metrics()

    def _define_metrics(self) -> None:
        reg = self.registry
        self._requests = Counter(
            "iop_requests", "Requests finished, by outcome code (ok or the error code).",
            ["operation", "model_group", "provider", "code"], registry=reg,
        )  # fmt: skip
        self._duration = Histogram(
            "iop_request_duration_seconds", "Time from request start to its end.",
            ["operation", "model_group", "provider"], buckets=DURATION_BUCKETS, registry=reg,
        )  # fmt: skip
        self._tokens = Counter(
            "iop_tokens", "Tokens in and out, attributed per the model's usage_attribution.",
            ["direction", "principal_ref", "token_ref", "model_group", "attributed_to",
             "attribution", "estimated"], registry=reg,
        )  # fmt: skip
        self._overflow = Counter(
            "iop_usage_overflow", "Requests folded into a collapsed ledger key (pending map full).",
            registry=reg,
        )  # fmt: skip
        self._flush_failures = Counter(
            "iop_usage_flush_failures", "Ledger writes that failed and were kept for retry.",
            registry=reg,
        )  # fmt: skip
        self._fallbacks = Counter(
            "iop_fallbacks", "Requests a fallback group served, by the group asked of (R-FALL-1).",
            ["model_group", "served_by"], registry=reg,
        )  # fmt: skip
        self._dropped = Counter(
            "iop_translation_dropped",
            "Fields a translation left out, by documented field ('other' for the rest) "
            "(R-XLATE-5).",
            ["field"], registry=reg,
        )  # fmt: skip
        self._queue_error = Histogram(
            "iop_queue_estimate_error_seconds",
            "Actual minus estimated queue wait of requests that queued (R-QUEUE-3).",
            buckets=QUEUE_ERROR_BUCKETS, registry=reg,
        )  # fmt: skip
        self._spend = Counter(
            "iop_spend",
            "Cost of the tokens metered, in metering.currency (R-COST-2): the provider's price, "
            "else its model group's; estimated when the tokens were.",
            ["principal", "model_group", "provider", "estimated"], registry=reg,
        )  # fmt: skip
        self._budget_read_failures = Counter(
            "iop_budget_read_failures", "Ledger reads for budgets that failed (R-BUD-1).",
            registry=reg,
        )  # fmt: skip
        self._requests_dropped = Counter(
            "iop_request_log_dropped", "Request-log rows dropped: the pending list was full.",
            registry=reg,
        )  # fmt: skip
        self.latency = LatencyMetrics(reg)  # R-OBS-3
        pending = Gauge("iop_usage_pending_keys", "Ledger keys not yet written.", registry=reg)
        pending.set_function(lambda: len(self.pending))

    def queue_estimate(self, estimated_s: float, actual_s: float) -> None:
        """R-QUEUE-3: a queued request's wait against the estimate it was admitted on."""
        self._queue_error.observe(actual_s - estimated_s)

    def translation_dropped(self, fields: Iterable[str]) -> None:
        """R-XLATE-5: one translated attempt left these out (bounded labels: documented
        field names or ``other``)."""
        for name in fields:
            self._dropped.labels(name).inc()

    def record(self, record: RequestRecord) -> None:
        """Count one finished request; synchronous and O(1), no I/O."""
        snapshot, routes = self._snapshot(), self.route_labels()
        if snapshot is not self._index_for or routes is not self._routes_for or not self._index:
            index = LabelIndex(snapshot, self._operations, self._codes, routes)
            self._index, self._index_for, self._routes_for = index, snapshot, routes
        index = self._index
        lab = index.labels(record)
        tokens_in, tokens_out = token_count(record.input_tokens), token_count(record.output_tokens)
        cached = min(token_count(record.cached_input_tokens), tokens_in)
        cost = index.cost_pico(lab, tokens_in, cached, tokens_out) if tokens_in or tokens_out else 0
        cost = min(cost, MAX_PICO)  # R-IN-6: absurd figures never fail a ledger write
        estimated = bool(record.estimated)
        counted = 0 if record.tokens_only else 1  # R-BUD-2: a discarded attempt's tokens
        if counted:
            requests, duration = self._request_series(lab)
            requests.inc()
            duration.observe(max(float(record.duration_s), 0.0))
        if tokens_in or tokens_out:
            counted_in, counted_out = self._token_series(lab, estimated)
            counted_in.inc(tokens_in)
            counted_out.inc(tokens_out)
        if cost:
            self._spend_series(lab, estimated).inc(cost / PICO)
        asked = record.requested_group
        if asked:  # R-FALL-1: a configured id only, like every label
            asked = asked if self._index.known_group(asked) else NO_LABEL
            self._fallbacks.labels(asked, lab.model_group).inc(counted)
        key = UsageKey(
            hour_bucket(self._clock()), lab.principal_ref, lab.token_ref, lab.model_group,
            lab.attributed_to, lab.attribution, estimated, asked or NO_LABEL,
        )  # fmt: skip
        counts = Counts(counted, int(lab.failed) * counted, tokens_in, tokens_out, cached, cost)
        if self.pending.add(key, counts):
            self._overflow.inc()
        self.budgets.add(lab.principal_ref, key.bucket, tokens_in + tokens_out, cost)
        if counted:  # a discarded attempt is no request: no latency, no request-log row
            self.latency.observe(record, lab, tokens_out)
            row = (self._clock(), record, lab, (tokens_in, tokens_out, cached, cost),
                   key.requested_group)  # fmt: skip
            if not self.requests.add(*row):
                self._requests_dropped.inc()
        self.start()
        full = self.pending.full or len(self.requests) >= self.requests.max_rows
        if full and self._wake is not None:
            self._wake.set()  # a full map asks for an early flush

    def _request_series(self, lab: RequestLabels) -> tuple[Any, Any]:
        # Children are cached: label lookups dominate record()'s cost otherwise. The caches
        # are bounded like the series themselves (label values are config ids or "-").
        series = self._request_cache.get(lab)
        if series is None:
            series = self._request_cache[lab] = (
                self._requests.labels(lab.operation, lab.model_group, lab.provider, lab.code),
                self._duration.labels(lab.operation, lab.model_group, lab.provider),
            )
        return series

    def _token_series(self, lab: RequestLabels, estimated: bool) -> tuple[Any, Any]:
        series = self._token_cache.get((lab, estimated))
        if series is None:
            who = (lab.principal_ref, lab.token_ref, lab.model_group, lab.attributed_to,
                   lab.attribution, "true" if estimated else "false")  # fmt: skip
            series = self._token_cache[(lab, estimated)] = (
                self._tokens.labels("in", *who),
                self._tokens.labels("out", *who),
            )
        return series

    def _spend_series(self, lab: RequestLabels, estimated: bool) -> Any:
        series = self._spend_cache.get((lab, estimated))
        if series is None:
            series = self._spend_cache[(lab, estimated)] = self._spend.labels(
                lab.principal_ref, lab.model_group, lab.provider, "true" if estimated else "false"
            )
        return series

    def start(self) -> None:
        """Start the periodic flush task in the running loop; idempotent, no-op without a loop."""
        if self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._loop is loop and self._task is not None and not self._task.done():
            return
        self._bind(loop)
        self._task = loop.create_task(self._run(), name="iop-usage-flush")

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        # asyncio primitives belong to one loop; a meter reused under a new loop gets new ones.
        if self._loop is not loop:
            self._loop, self._wake, self._lock = loop, asyncio.Event(), asyncio.Lock()

    async def _run(self) -> None:
        assert self._wake is not None
        wake = self._wake
        while True:
            try:
                async with asyncio.timeout(self._interval):
                    await wake.wait()
            except TimeoutError:
                pass
            wake.clear()
            # Shielded: cancelling the loop task never abandons a batch half-way; aclose()
            # waits for it through the lock before its final flush.
            await asyncio.shield(self.flush())
            await asyncio.shield(self.refresh_budgets())

    def configure_budgets(self, kinds: dict[str, Counted]) -> None:
        """The budgeted principals of a new snapshot; a new one is read from the ledger at
        once (its admissions wait for that read: ``BudgetView.unread``)."""
        if self.budgets.configure(kinds):
            self.start()
            if self._wake is not None:
                self._wake.set()

    async def refresh_budgets(self) -> None:
        """Read the budgeted principals' figures from the ledger (R-BUD-1). Under the flush
        lock, so every token is either in the ledger or still pending, never both."""
        if self.budgets.empty:
            return
        self._bind(asyncio.get_running_loop())
        assert self._lock is not None
        async with self._lock:
            wanted = self.budgets.wanted(self._clock())
            read = sync_to_async(self._budget_reader, thread_sensitive=False)
            try:
                figures = await read(wanted)
            except Exception as exc:  # the last figures stay, this Edge's usage keeps adding
                self._budget_read_failures.inc()
                logger.warning("usage ledger read for budgets failed (%s)", type(exc).__name__)
                self.budgets.read_failed(self._clock())
                return
            self.budgets.refreshed(wanted, figures, self.pending.items())

    async def flush(self) -> int:
        """Write the pending aggregates in one batch; return the number of rows upserted."""
        self._bind(asyncio.get_running_loop())
        assert self._lock is not None
        async with self._lock:
            await self._flush_requests()
            batch = self.pending.take()
            if not batch:
                return 0
            prune_before = self._prune_due()
            write = sync_to_async(self._writer, thread_sensitive=False)
            try:
                return await write(batch, prune_before)
            except Exception as exc:
                # Keep the batch for the next flush; the message may quote row values, so
                # only the error type is logged.
                self.pending.merge(batch)
                if prune_before is not None:
                    self._next_prune = 0.0  # the prune did not happen either
                self._flush_failures.inc()
                logger.warning(
                    "usage ledger write failed (%s); %d keys kept for the next flush",
                    type(exc).__name__, len(batch),
                )  # fmt: skip
                return 0

    async def _flush_requests(self) -> None:
        """Write the pending request-log rows (R-OBS-1); on failure they are kept (bounded)."""
        rows = self.requests.take()
        prune_before = None
        if self._request_retention_days > 0 and time.monotonic() >= self._next_request_prune:
            self._next_request_prune = time.monotonic() + PRUNE_EVERY_S
            now = datetime.fromtimestamp(self._clock(), tz=UTC)
            prune_before = now - timedelta(days=self._request_retention_days)
        if not rows and prune_before is None:
            return
        write = sync_to_async(self._rows_writer, thread_sensitive=False)
        try:
            await write(rows, prune_before)
        except Exception as exc:
            dropped = self.requests.dropped
            self.requests.merge(rows)
            self._requests_dropped.inc(self.requests.dropped - dropped)
            if prune_before is not None:
                self._next_request_prune = 0.0
            self._flush_failures.inc()
            logger.warning(
                "request log write failed (%s); %d rows kept for the next flush",
                type(exc).__name__, len(rows),
            )  # fmt: skip

    def _prune_due(self) -> datetime | None:
        if self._retention_days <= 0 or time.monotonic() < self._next_prune:
            return None
        self._next_prune = time.monotonic() + PRUNE_EVERY_S
        return datetime.fromtimestamp(self._clock(), tz=UTC) - timedelta(days=self._retention_days)

    async def aclose(self) -> None:
        """Stop the periodic task and write what is pending."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            await asyncio.wait([task])
        await self.flush()
