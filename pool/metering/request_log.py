"""The request log (R-OBS-1): one ledger row per finished request, found by its request id.

The meter keeps rows in a bounded list and writes them with its batch (never per request on
the request path); rows older than ``IOP_REQUEST_LOG_RETENTION_DAYS`` (7 by default, 0 keeps
all) are deleted by the same flush. While the database is gone the rows wait, up to
``MAX_PENDING_ROWS``; a full list drops the oldest rows and counts them
(``iop_request_log_dropped_total``, R-HA-3); the hourly usage buckets still count every
request (the ledger never drops: it folds keys, ``pending.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from pool.metering.labels import NO_LABEL, RequestLabels, RequestRecord

RETENTION_SETTING = "IOP_REQUEST_LOG_RETENTION_DAYS"
DEFAULT_RETENTION_DAYS = 7
MAX_PENDING_ROWS = 20_000  # about four seconds of a busy Edge between flushes, at most
_BATCH_SIZE = 1000


def retention_days(setting: str, default: int) -> int:
    """Days of rows to keep, from the Django setting ``setting``; 0 keeps all."""
    days = getattr(settings, setting, default)
    if not isinstance(days, int) or isinstance(days, bool) or days < 0:
        raise ImproperlyConfigured(f"{setting}: must be 0 (keep all) or more days")
    return days


def request_log_retention_days() -> int:
    return retention_days(RETENTION_SETTING, DEFAULT_RETENTION_DAYS)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(max(seconds, 0.0) * 1000, 3)


class PendingRequests:
    """Rows not yet written, bounded; each is a tuple in ``RequestLogEntry.ROW_FIELDS`` order."""

    __slots__ = ("_rows", "dropped", "max_rows")

    def __init__(self, max_rows: int = MAX_PENDING_ROWS) -> None:
        self.max_rows = max_rows
        self._rows: deque[tuple[object, ...]] = deque()
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._rows)

    def add(
        self,
        at: float,
        record: RequestRecord,
        lab: RequestLabels,
        tokens: tuple[int, int, int, int],
        requested_group: str = NO_LABEL,
    ) -> bool:
        """Keep one finished request (``tokens``: input, output, cached input, cost in
        10^-12 of the currency); False when the list was full (its oldest row is dropped
        to make room, R-HA-3). ``requested_group``: the group asked of when a fallback served
        it (bounded)."""
        kept = len(self._rows) < self.max_rows
        if not kept:
            self._rows.popleft()
            self.dropped += 1
        self._rows.append((
            record.request_id[:128], at, record.trace_id[:32], lab.operation,
            lab.principal_ref, lab.token_ref, lab.model_group, requested_group, lab.provider,
            (record.node_id or "")[:200], int(record.status), lab.code, *tokens,
            bool(record.estimated), bool(record.stream), _ms(record.queue_wait_s),
            _ms(record.ttft_s), _ms(record.duration_s),
        ))  # fmt: skip
        return kept

    def take(self) -> list[tuple[object, ...]]:
        rows, self._rows = list(self._rows), deque()
        return rows

    def merge(self, rows: list[tuple[object, ...]]) -> None:
        """Put back rows a failed write could not store, before the newer ones (the same
        bound applies: the oldest go first)."""
        room = max(self.max_rows - len(self._rows), 0)
        self.dropped += max(len(rows) - room, 0)
        self._rows.extendleft(reversed(rows[len(rows) - room :] if room else []))


def write_rows(rows: list[tuple[object, ...]], prune_before: datetime | None) -> int:
    """Insert ``rows`` and delete entries older than ``prune_before`` (sync, worker thread).
    One ``executemany`` per batch, not model instances: the ORM's per-row cost was a fifth
    of the Edge's CPU at 3000 requests per second (docs/performance-history.md)."""
    from django.db import connection, transaction

    from pool.metering.models import RequestLogEntry

    with transaction.atomic():
        if rows:
            sql, at = _insert_sql(RequestLogEntry)
            when = at_value(connection)
            params = [(*row[:at], when(row[at]), *row[at + 1 :]) for row in rows]  # type: ignore[arg-type]
            with connection.cursor() as cursor:
                for start in range(0, len(params), _BATCH_SIZE):
                    cursor.executemany(sql, params[start : start + _BATCH_SIZE])
        if prune_before is not None:
            RequestLogEntry.objects.filter(at__lt=prune_before).delete()
    return len(rows)


def at_value(connection: Any) -> Callable[[float], object]:
    """A row's ``at`` (Unix time) as ``connection`` stores a datetime: what Django's
    ``adapt_datetimefield_value`` returns, without its checks per value (a third of the
    writer's Python time per row on SQLite): SQLite takes the naive time in the connection's
    zone as text, the others the aware datetime."""
    if connection.vendor == "sqlite":
        zone = connection.timezone

        def sqlite_text(at: float) -> object:
            return str(datetime.fromtimestamp(at, tz=zone).replace(tzinfo=None))

        return sqlite_text
    adapt = connection.ops.adapt_datetimefield_value

    def adapted(at: float) -> object:
        return adapt(datetime.fromtimestamp(at, tz=UTC))

    return adapted


def _insert_sql(model: Any) -> tuple[str, int]:
    """The INSERT of one row of ``model.ROW_FIELDS``, and where ``at`` is in a row."""
    from django.db import connection

    quote = connection.ops.quote_name
    fields = model.ROW_FIELDS
    columns = ", ".join(quote(model._meta.get_field(name).column) for name in fields)
    marks = ", ".join(["%s"] * len(fields))
    sql = f"INSERT INTO {quote(model._meta.db_table)} ({columns}) VALUES ({marks})"
    return sql, fields.index("at")
