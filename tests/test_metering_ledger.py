"""The usage ledger: batched upserts into hour buckets, retention, and the read-only admin."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from asgiref.sync import sync_to_async
from django.db import IntegrityError, connections
from django.urls import reverse

from catalog.config import EdgeSnapshot, load_snapshot
from pool.metering import UsageMeter
from pool.metering import store as ledger
from pool.metering.pending import Counts, UsageKey
from pool.models import UsageBucket
from tests.support.metering import record_factory

HOUR_0 = 1_759_996_800  # 2025-10-09 08:00 UTC
COLUMNS = ("principal_ref", "token_ref", "model_group", "attributed_to", "attribution",
           "estimated", "requests", "errors", "input_tokens", "output_tokens")  # fmt: skip

CONFIG = """
edge: {id: edge-test, listen: 127.0.0.1:17700}
admin: {listen: 127.0.0.1:17701}
openai:
  listen: 127.0.0.1:18080
  principal_tokens:
    - {token_ref: app-notebook, principal_ref: team-research,
       token_hash_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}
    - {token_ref: app-ci, principal_ref: team-research,
       token_hash_sha256: 60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752}
nodes:
  - id: node-a
    token_hash_sha256: 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae
    providers:
      - {id: vllm-local, profile: openai, base_url: "http://127.0.0.1:8000/v1", capacity: 2}
      - {id: ollama-local, profile: ollama, base_url: "http://127.0.0.1:11434", capacity: 1}
models:
  - id: qwen-local
    providers: {vllm-local: Qwen/Qwen2.5-7B-Instruct, ollama-local: "qwen2.5:7b"}
  - id: qwen-pooled
    usage_attribution: model_group
    providers: {vllm-local: Qwen/Qwen2.5-7B-Instruct, ollama-local: "qwen2.5:7b"}
"""


def snapshot() -> EdgeSnapshot:
    return load_snapshot(yaml.safe_load(CONFIG))


record = record_factory(input_tokens=10, output_tokens=20, duration_s=0.1, stream=False)


def key(bucket: int = HOUR_0, **changes: Any) -> UsageKey:
    fields: dict[str, Any] = {
        "principal_ref": "team-research", "token_ref": "app-notebook",
        "model_group": "qwen-local", "attributed_to": "vllm-local",
        "attribution": "provider", "estimated": False,
    }  # fmt: skip
    fields.update(changes)
    return UsageKey(bucket=bucket, **fields)


def read_rows() -> list[tuple[Any, ...]]:
    try:
        rows = UsageBucket.objects.order_by("bucket_start", "token_ref", "attributed_to")
        return [(row.bucket_start, *(getattr(row, c) for c in COLUMNS)) for row in rows]
    finally:
        connections.close_all()


rows_from_thread = sync_to_async(read_rows, thread_sensitive=False)


def at(bucket: int) -> datetime:
    return datetime.fromtimestamp(bucket, tz=UTC)


@pytest.mark.django_db(transaction=True)
async def test_flush_upserts_one_row_per_hour_and_key() -> None:
    """R-AUTH-1, R-CFG-4: rows per (hour, principal, token, group, attribution), summed."""
    clock = {"now": HOUR_0 + 60.0}
    active = snapshot()
    meter = UsageMeter(lambda: active, flush_interval_s=60.0, retention_days=0,
                       clock=lambda: clock["now"])  # fmt: skip
    meter.record(record())
    meter.record(record(status=502, code="upstream_error", output_tokens=0))
    meter.record(record(token_ref="app-ci", model_group="qwen-pooled", provider_id="ollama-local"))
    assert await meter.flush() == 2
    meter.record(record(input_tokens=5, output_tokens=5))
    clock["now"] = HOUR_0 + 3600 + 1.0  # the next hour gets its own row
    meter.record(record(input_tokens=1, output_tokens=1, estimated=True))
    assert await meter.flush() == 2
    await meter.aclose()
    rows = await rows_from_thread()
    assert rows == [
        (at(HOUR_0), "team-research", "app-ci", "qwen-pooled", "qwen-pooled", "model_group",
         False, 1, 0, 10, 20),
        (at(HOUR_0), "team-research", "app-notebook", "qwen-local", "vllm-local", "provider",
         False, 3, 1, 25, 25),
        (at(HOUR_0 + 3600), "team-research", "app-notebook", "qwen-local", "vllm-local",
         "provider", True, 1, 0, 1, 1),
    ]  # fmt: skip


@pytest.mark.django_db(transaction=True)
async def test_runtime_meter_writes_the_ledger_on_aclose() -> None:
    from iop_site.runtime import EdgeRuntime

    runtime = EdgeRuntime(snapshot())
    runtime.meter.record(record(model_group="qwen-pooled", provider_id="vllm-local"))
    await runtime.aclose()
    rows = await rows_from_thread()
    assert [row[3:5] for row in rows] == [("qwen-pooled", "qwen-pooled")]


@pytest.mark.django_db
def test_write_batch_adds_to_an_existing_row() -> None:
    assert ledger.write_batch({key(): Counts(1, 0, 10, 20)}) == 1
    assert ledger.write_batch({key(): Counts(2, 1, 5, 0), key(token_ref="app-ci"): Counts(1)}) == 2
    row = UsageBucket.objects.get(token_ref="app-notebook")
    assert (row.requests, row.errors, row.input_tokens, row.output_tokens) == (3, 1, 15, 20)
    assert UsageBucket.objects.count() == 2


@pytest.mark.django_db
def test_a_conflicting_insert_retries_the_whole_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process inserting the same key first rolls the batch back and retries it once."""
    real = ledger._upsert
    calls = {"n": 0}

    def racing(batch: Any) -> int:
        calls["n"] += 1
        touched = real(batch)
        if calls["n"] == 1:
            raise IntegrityError("duplicate key value violates unique constraint")
        return touched

    monkeypatch.setattr(ledger, "_upsert", racing)
    assert ledger.write_batch({key(): Counts(1, 0, 10, 20)}) == 1
    row = UsageBucket.objects.get()
    assert calls["n"] == 2
    assert (row.requests, row.input_tokens) == (1, 10)  # counted once


@pytest.mark.django_db
def test_retention_drops_rows_older_than_the_cutoff() -> None:
    now = at(HOUR_0)
    ledger.write_batch({key(HOUR_0 - 91 * 86400): Counts(1), key(HOUR_0 - 89 * 86400): Counts(2),
                        key(HOUR_0): Counts(3)})  # fmt: skip
    cutoff = now - timedelta(days=90)
    ledger.write_batch({key(HOUR_0): Counts(1)}, prune_before=cutoff)
    kept = sorted(UsageBucket.objects.values_list("requests", flat=True))
    assert kept == [2, 4]


@pytest.mark.django_db
def test_admin_lists_usage_read_only_with_filters(admin_client: Any) -> None:
    ledger.write_batch({
        key(): Counts(3, 1, 30, 60),
        key(model_group="qwen-pooled", attributed_to="qwen-pooled", attribution="model_group",
            token_ref="app-ci"): Counts(5, 0, 50, 10),
    })  # fmt: skip
    url = reverse("admin:pool_usagebucket_changelist")
    page = admin_client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    for title in ("By model group", "By attributed to", "By principal ref", "By token ref",
                  "By estimated"):  # fmt: skip
        assert title in html
    filtered = admin_client.get(url, {"token_ref": "app-ci"})
    assert filtered.status_code == 200
    assert list(filtered.context["cl"].result_list.values_list("token_ref", flat=True)) == [
        "app-ci"
    ]
    assert admin_client.get(reverse("admin:pool_usagebucket_add")).status_code == 403
    row = UsageBucket.objects.get(token_ref="app-notebook")
    change = reverse("admin:pool_usagebucket_change", args=[row.pk])
    assert admin_client.post(change, {"requests": "999"}).status_code == 403
    assert (
        admin_client.get(reverse("admin:pool_usagebucket_delete", args=[row.pk])).status_code == 403
    )
    row.refresh_from_db()
    assert row.requests == 3


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_of_the_same_new_keys_count_every_request() -> None:
    """Two Edge processes flushing the same new key: one inserts, the other retries and adds."""
    if connections["default"].vendor != "postgresql":
        pytest.skip("needs DATABASE_URL pointing at PostgreSQL")
    writers, hours = 4, 10
    barrier = threading.Barrier(writers, timeout=30)
    failures: list[BaseException] = []

    def write_all() -> None:
        try:
            for n in range(hours):
                barrier.wait()
                ledger.write_batch({key(HOUR_0 + 3600 * n): Counts(1, 0, 2, 3)})
        except BaseException as exc:  # reported below, in the test's thread
            failures.append(exc)
            barrier.abort()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=write_all) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    totals = list(UsageBucket.objects.values_list("requests", "input_tokens", "output_tokens"))
    assert sorted(totals) == [(writers, 2 * writers, 3 * writers)] * hours


@pytest.mark.django_db
def test_cached_tokens_and_cost_are_summed_exactly_and_shown_r_cost_2(admin_client) -> None:
    """R-COST-2: the ledger adds cached input tokens and cost (10^-12 units, 64-bit) like
    the other figures; the admin shows the cost as an exact decimal, starred if estimated."""
    ledger.write_batch({key(): Counts(1, 0, 1000, 100, 400, 180_000_000)})
    ledger.write_batch({key(): Counts(1, 0, 1000, 100, 400, 180_000_000),
                        key(estimated=True): Counts(1, 0, 10, 0, 0, 1)})  # fmt: skip
    row = UsageBucket.objects.get(estimated=False)
    assert (row.cached_input_tokens, row.cost_pico) == (800, 360_000_000)
    html = admin_client.get(reverse("admin:pool_usagebucket_changelist")).content.decode()
    assert "0.00036<" in html and "0.000000000001 *<" in html


@pytest.mark.django_db
def test_a_cost_past_64_bits_is_saturated_not_a_failed_batch_r_in_6() -> None:
    """R-IN-6: the largest token figures at the largest price cost more than a 64-bit column
    holds; the row keeps the column's maximum and the batch is written."""
    huge = 999_999_999_999 * 10**12  # tokens * the largest price per token, in 10^-12 units
    assert ledger.write_batch({key(): Counts(1, 0, 999_999_999_999, 0, 0, huge)}) == 1
    assert ledger.write_batch({key(): Counts(1, 0, 1, 0, 0, huge)}) == 1
    assert UsageBucket.objects.get().cost_pico == 2**63 - 1
