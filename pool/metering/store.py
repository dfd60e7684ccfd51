"""Write one batch of usage aggregates to the ledger (sync; the meter runs it in a worker thread).

An upsert that works the same on SQLite and PostgreSQL: the batch's existing rows are read
under ``select_for_update`` and incremented, missing rows are inserted, all in one
transaction; a concurrent insert of the same key (another Edge process) retries the batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from django.db import IntegrityError, connection, transaction

from catalog.config.money import MAX_PICO
from pool.metering.models import UsageBucket
from pool.metering.pending import Counts, UsageKey

COUNTED = ("requests", "errors", "input_tokens", "output_tokens", "cached_input_tokens",
           "cost_pico")  # fmt: skip
_ATTEMPTS = 3
_BATCH_SIZE = 500


def bucket_datetime(bucket: int) -> datetime:
    """The aware UTC datetime of an hour bucket given in epoch seconds."""
    return datetime.fromtimestamp(bucket, tz=UTC)


def write_batch(batch: Mapping[UsageKey, Counts], *, prune_before: datetime | None = None) -> int:
    """Add ``batch`` to the ledger; drop rows older than ``prune_before``; return rows upserted."""
    for attempt in range(_ATTEMPTS):
        try:
            with transaction.atomic():
                _take_write_lock()
                touched = _upsert(batch) if batch else 0
                if prune_before is not None:
                    UsageBucket.objects.filter(bucket_start__lt=prune_before).delete()
            return touched
        except IntegrityError:
            if attempt == _ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _take_write_lock() -> None:
    # SQLite: a transaction that reads first and writes later cannot wait for another
    # writer (the lock upgrade fails at once with "database is locked"); writing first
    # takes the write lock up front, waiting up to the busy timeout like any writer.
    if connection.vendor == "sqlite":
        UsageBucket.objects.filter(pk__lt=0).update(requests=0)


def _upsert(batch: Mapping[UsageKey, Counts]) -> int:
    now = datetime.now(tz=UTC)
    wanted = {_row_key(key): counts for key, counts in batch.items()}
    hours = {key[0] for key in wanted}
    groups = {key[3] for key in wanted}
    # One read for the whole batch: a batch spans one or two hours, so this stays small.
    existing = UsageBucket.objects.select_for_update().filter(
        bucket_start__in=hours, model_group__in=groups
    )
    changed: list[UsageBucket] = []
    for row in existing:
        counts = wanted.pop(_model_key(row), None)
        if counts is None:
            continue
        row.requests += counts.requests
        row.errors += counts.errors
        row.input_tokens += counts.input_tokens
        row.output_tokens += counts.output_tokens
        row.cached_input_tokens += counts.cached_input_tokens
        row.cost_pico = min(row.cost_pico + counts.cost_pico, MAX_PICO)  # saturated, R-IN-6
        row.updated_at = now
        changed.append(row)
    if changed:
        UsageBucket.objects.bulk_update(
            changed,
            [*COUNTED, "updated_at"],
            batch_size=_BATCH_SIZE,
        )
    created = [
        UsageBucket(
            **dict(zip(UsageBucket.KEY_FIELDS, key, strict=True)),
            requests=counts.requests,
            errors=counts.errors,
            input_tokens=counts.input_tokens,
            output_tokens=counts.output_tokens,
            cached_input_tokens=counts.cached_input_tokens,
            cost_pico=min(counts.cost_pico, MAX_PICO),
            updated_at=now,
        )
        for key, counts in wanted.items()
    ]
    if created:
        UsageBucket.objects.bulk_create(created, batch_size=_BATCH_SIZE)
    return len(changed) + len(created)


def _row_key(key: UsageKey) -> tuple[object, ...]:
    return (
        bucket_datetime(key.bucket),
        key.principal_ref,
        key.token_ref,
        key.model_group,
        key.attributed_to,
        key.attribution,
        key.estimated,
        key.requested_group,
    )


def _model_key(row: UsageBucket) -> tuple[object, ...]:
    return tuple(getattr(row, name) for name in UsageBucket.KEY_FIELDS)
