"""R-OBS-1 on the ledger and R-OBS-3 in the meter: one request-log row per request, written in
the meter's batches and kept for a bounded time; latency histograms and the TTFT window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.urls import reverse

from pool.metering import UsageMeter
from pool.metering.latency import TTFTWindow
from pool.metering.request_log import PendingRequests, at_value, write_rows
from pool.models import RequestLogEntry
from tests.support.metering import record_factory
from tests.test_metering_meter import NOW, config, make_meter, samples

record = record_factory(input_tokens=12, output_tokens=30, duration_s=2.0, stream=True)


def rows(meter: UsageMeter) -> list[tuple[object, ...]]:
    return meter.requests.take()


def test_each_request_becomes_one_pending_row_with_its_id_and_timings() -> None:
    """R-OBS-1: the row holds the request id, bounded labels and the request's timings."""
    meter, _ = make_meter()
    meter.record(record(request_id="req-1", trace_id="t" * 32, node_id="node-a",
                        queue_wait_s=0.25, ttft_s=0.5))  # fmt: skip
    meter.record(record(request_id="req-2", status=502, code="upstream_error", provider_id="x"))
    first, second = (dict(zip(RequestLogEntry.ROW_FIELDS, row, strict=True)) for row in rows(meter))
    assert first["request_id"] == "req-1" and first["at"] == NOW
    assert (first["model_group"], first["provider"], first["node"]) == (
        "qwen-local", "vllm-local", "node-a",
    )  # fmt: skip
    assert (first["status"], first["code"], first["queue_wait_ms"], first["ttft_ms"]) == (
        200, "ok", 250.0, 500.0,
    )  # fmt: skip
    assert (first["input_tokens"], first["output_tokens"], first["duration_ms"]) == (12, 30, 2000)
    assert (second["provider"], second["code"], second["ttft_ms"]) == ("-", "upstream_error", None)


def test_a_request_a_fallback_group_served_names_the_group_asked_of_r_fall_1() -> None:
    """R-FALL-1: the row of a request served by a fallback group names the serving group and
    the group asked of (a configured id, else ``-``); any other request has ``-`` there."""
    meter, _ = make_meter()
    meter.record(
        record(request_id="moved", model_group="qwen-pooled", requested_group="qwen-local")
    )
    meter.record(record(request_id="own"))
    meter.record(record(request_id="odd", requested_group="no-such-group"))
    moved, own, odd = (dict(zip(RequestLogEntry.ROW_FIELDS, r, strict=True)) for r in rows(meter))
    assert (moved["model_group"], moved["requested_group"]) == ("qwen-pooled", "qwen-local")
    assert (own["model_group"], own["requested_group"]) == ("qwen-local", "-")
    assert odd["requested_group"] == "-"


def test_a_full_pending_list_drops_and_counts_the_oldest_rows_r_ha_3() -> None:
    """The request log is bounded: the newest rows are kept (R-HA-3); the hourly buckets
    still count every request."""
    meter, _ = make_meter()
    meter.requests = PendingRequests(max_rows=2)
    for n in range(5):
        meter.record(record(request_id=f"req-{n}"))
    assert [row[0] for row in rows(meter)] == ["req-3", "req-4"]
    assert samples(meter, "iop_request_log_dropped_total") == {frozenset(): 3.0}
    assert sum(c.requests for c in meter.pending.take().values()) == 5


def test_rows_a_failed_write_kept_go_back_before_the_newer_ones_oldest_dropped_r_ha_3() -> None:
    meter, _ = make_meter()
    meter.requests = PendingRequests(max_rows=3)
    for n in range(3):
        meter.record(record(request_id=f"req-{n}"))
    failed = meter.requests.take()  # a write that failed: the database is gone
    meter.record(record(request_id="req-3"))
    meter.requests.merge(failed)
    assert [row[0] for row in rows(meter)] == ["req-1", "req-2", "req-3"]
    assert meter.requests.dropped == 1


def test_latency_histograms_per_model_group_and_provider_r_obs_3() -> None:
    """R-OBS-3: queue wait, time to first token and output tokens per second."""
    meter, _ = make_meter()
    meter.record(record(queue_wait_s=0.2, ttft_s=0.5, duration_s=2.0, output_tokens=30))
    meter.record(record(queue_wait_s=0.1, stream=False, duration_s=1.1, output_tokens=50))
    where = frozenset({"model_group": "qwen-local", "provider": "vllm-local"}.items())
    assert samples(meter, "iop_queue_wait_seconds_count")[where] == 2
    assert samples(meter, "iop_queue_wait_seconds_sum")[where] == pytest.approx(0.3)
    assert samples(meter, "iop_time_to_first_token_seconds_count")[where] == 1
    assert samples(meter, "iop_time_to_first_token_seconds_sum")[where] == pytest.approx(0.5)
    # 30 tokens after the first, over 1.5 s; 50 tokens over 1.1 s less 0.1 s queued
    assert samples(meter, "iop_output_tokens_per_second_sum")[where] == pytest.approx(70.0)
    assert meter.latency.window.percentiles()["vllm-local"]["count"] == 1


def test_a_failed_request_adds_no_first_token_or_speed() -> None:
    meter, _ = make_meter()
    meter.record(record(status=502, code="upstream_error", ttft_s=0.3, queue_wait_s=0.1))
    where = frozenset({"model_group": "qwen-local", "provider": "vllm-local"}.items())
    assert samples(meter, "iop_queue_wait_seconds_count")[where] == 1
    assert samples(meter, "iop_time_to_first_token_seconds_count")[where] == 0
    assert samples(meter, "iop_output_tokens_per_second_count")[where] == 0


def test_the_ttft_window_keeps_recent_samples_per_provider_r_obs_3() -> None:
    """R-OBS-3: p50 / p95 over the last minutes, per provider; old samples leave."""
    now = {"t": 1000.0}
    window = TTFTWindow(window_s=300, max_samples=100, clock=lambda: now["t"])
    for ms in range(1, 101):
        window.add("p1", ms / 1000)
    window.add("p2", 2.0)
    figures = window.percentiles()
    assert figures["p1"] == {"p50_ms": 50.0, "p95_ms": 95.0, "count": 100}
    assert figures["p2"] == {"p50_ms": 2000.0, "p95_ms": 2000.0, "count": 1}
    now["t"] += 301
    window.add("p2", 0.1)
    assert window.percentiles() == {"p2": {"p50_ms": 100.0, "p95_ms": 100.0, "count": 1}}


@pytest.mark.django_db(transaction=True)
async def test_the_meter_writes_request_rows_in_its_batch_and_prunes_old_ones() -> None:
    """R-OBS-1: rows reach the table at the meter's flush; rows past retention are deleted."""
    old = datetime.fromtimestamp(NOW, tz=UTC) - timedelta(days=8)
    await sync_to_async(_old_row)(old)
    active = config()
    meter = UsageMeter(lambda: active, retention_days=0, clock=lambda: NOW,
                       request_retention_days=7)  # fmt: skip
    meter.record(record(request_id="req-flushed", ttft_s=0.4))
    assert await sync_to_async(RequestLogEntry.objects.count)() == 1  # nothing per request
    await meter.aclose()
    ids = await sync_to_async(lambda: sorted(RequestLogEntry.objects.values_list(
        "request_id", flat=True)))()  # fmt: skip
    assert ids == ["req-flushed"]


def _old_row(at: datetime) -> None:
    RequestLogEntry.objects.create(
        request_id="req-old", at=at, operation="chat_completions", status=200, code="ok",
        duration_ms=1.0,
    )  # fmt: skip


@pytest.mark.django_db
def test_admin_finds_a_request_by_its_id_read_only(admin_client: Any) -> None:
    """R-OBS-1: the request log is searchable by request id in the admin, and read-only."""
    meter, _ = make_meter()
    meter.record(record(request_id="req-find-me"))
    meter.record(record(request_id="req-other"))
    write_rows(rows(meter), None)
    url = reverse("admin:pool_requestlogentry_changelist")
    found = admin_client.get(url, {"q": "req-find-me"})
    assert found.status_code == 200
    assert list(found.context["cl"].result_list.values_list("request_id", flat=True)) == [
        "req-find-me"
    ]
    assert admin_client.get(reverse("admin:pool_requestlogentry_add")).status_code == 403
    entry = RequestLogEntry.objects.get(request_id="req-other")
    change = reverse("admin:pool_requestlogentry_change", args=[entry.pk])
    assert admin_client.post(change, {"status": "1"}).status_code == 403


@pytest.mark.django_db(transaction=True)
def test_rows_written_in_one_statement_read_back_field_for_field() -> None:
    """The batch insert (one ``executemany``, no model instances) stores every field as the
    ORM reads it back, on SQLite and on PostgreSQL: the time to the microsecond in UTC,
    booleans, empty and null values."""
    at = 1_796_000_000.123456
    full = (
        "req-a",
        at,
        "0af7651916cd43dd8448eb211c80319c",
        "chat_completions",
        "team",
        "app",
        "glm",
        "glm-main",
        "p1",
        "n1",
        200,
        "ok",
        12,
        30,
        8,
        9_223_372_036_854_775_807,  # cost in 10^-12 units: the column holds a 64-bit figure
        True,
        True,
        1.5,
        40.25,
        2000.0,
    )
    bare = ("req-b", at + 1, "", "responses", "-", "-", "-", "-", "-", "", 429, "rate_limited",
            0, 0, 0, 0, False, False, None, None, 0.5)  # fmt: skip
    assert write_rows([full, bare], None) == 2
    fields = RequestLogEntry.ROW_FIELDS
    stored = {
        e.request_id: e for e in RequestLogEntry.objects.filter(request_id__in=["req-a", "req-b"])
    }
    for row in (full, bare):
        entry = stored[str(row[0])]
        for name, value in zip(fields, row, strict=True):
            if name == "at":
                expected = datetime.fromtimestamp(float(value), tz=UTC)  # type: ignore[arg-type]
                assert entry.at == expected
            else:
                assert getattr(entry, name) == value, name


@pytest.mark.django_db
def test_the_writer_stores_each_time_as_djangos_own_adaptation_would() -> None:
    """The writer adapts ``at`` itself (no per-value checks): the same value Django gives,
    whole seconds (no fraction written) and microseconds alike, on either database."""
    from django.db import connection

    when = at_value(connection)
    for at in (0.0, 1_796_000_000.0, 1_796_000_000.123456, 1_796_000_000.999999):
        expected = connection.ops.adapt_datetimefield_value(datetime.fromtimestamp(at, tz=UTC))
        assert when(at) == expected
