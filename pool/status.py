"""Pool status for staff: the snapshot as JSON (`/api/pool/`) and a live admin page.

The page polls a small JSON endpoint once a second; each row carries a ``state`` computed
here, so the server-rendered table and the live updates colour providers the same way.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from asgiref.sync import async_to_sync
from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from edgekit.http import error_body
from edgekit.running import get_runtime
from pool.engine import PoolBackendUnavailable
from pool.gate.counters import OUTCOMES
from pool.metering.latency import WINDOW_S as TTFT_WINDOW_S

# Most to least urgent; the summary line lists counts in this order.
STATES = ("ejected", "probing", "saturated", "busy", "idle", "disabled", "unavailable", "offline")
POLL_INTERVAL_MS = 1000


async def _snapshot_on_loop() -> dict[str, Any]:
    return await get_runtime().pool_status()


def read_snapshot() -> dict[str, Any]:
    """The pool snapshot as a dict, taken on the event loop that owns the pool, at most the
    engine's stated age old (R-SCALE-8; ``PoolBackendUnavailable`` otherwise).

    Sync views run in a worker thread; reading the pool there could race with a decision on
    the loop, so the read hops back to the loop (asgiref runs it on the outer loop).
    """
    return async_to_sync(_snapshot_on_loop)()


def unavailable() -> JsonResponse:
    """503 ``pool_unavailable``: the shared pool cannot be read within its age bound."""
    body = error_body(
        "pool_unavailable", "the shared provider pool cannot be read now", type="server_error"
    )
    response = JsonResponse(body, status=503)
    response["Retry-After"] = "1"
    return response


def provider_state(row: Mapping[str, Any]) -> str:
    """unavailable (its Node refused it, R-TLS-3), offline, disabled, ejected / probing
    (R-HEALTH-4), saturated (no free slot), busy (some in flight) or idle."""
    if row.get("unavailable"):
        return "unavailable"
    if not row["online"]:
        return "offline"
    if not row["enabled"]:
        return "disabled"
    if row["health"] != "healthy":
        return str(row["health"])
    if row["in_flight"] >= row["capacity"]:
        return "saturated"
    if row["in_flight"] > 0:
        return "busy"
    return "idle"


def format_wait(ms: float) -> str:
    """A wait for people: "-" when nothing waits, ms below a second, else seconds."""
    if ms <= 0:
        return "-"
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def format_left(seconds: float) -> str:
    """Time left of an ejection: "" when none, else whole seconds or minutes and seconds."""
    if seconds <= 0:
        return ""
    whole = max(1, round(seconds))
    return f"{whole} s" if whole < 60 else f"{whole // 60} min {whole % 60} s"


def health_text(row: Mapping[str, Any]) -> str:
    """The health column: the reason and, while ejected, the time left (R-HEALTH-4)."""
    reason, left = row["health_reason"], format_left(row["ejected_for_s"])
    if row["health"] == "ejected":
        return f"{reason}; back in {left}" if left else reason
    if row["health"] == "probing":
        return f"one trial request after: {reason}" if reason else "one trial request"
    return "-"


def ttft_text(figures: Mapping[str, Any] | None) -> str:
    """p50 / p95 time to first token over the recent window (R-OBS-3), or "-"."""
    if not figures:
        return "-"
    return f"{format_wait(figures['p50_ms'])} / {format_wait(figures['p95_ms'])}"


def _row(
    row: Mapping[str, Any],
    gate: Mapping[str, Mapping[str, int]],
    ttft: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    capacity, in_flight = row["capacity"], row["in_flight"]
    load = min(100, round(100 * in_flight / capacity)) if capacity > 0 else 0
    counts = gate.get(row["provider_id"], {})
    # Stream Evidence Gate: fired / recovered / exhausted / observed (R-SEG-6, R-SEG-8)
    gate_text = " / ".join(str(counts.get(outcome, 0)) for outcome in OUTCOMES)
    return {
        **row,
        "state": provider_state(row),
        "load_pct": load,
        "health_text": health_text(row),
        "gate": gate_text,
        "ttft": ttft_text((ttft or {}).get(row["provider_id"])),
    }


def status_view(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """The snapshot with ``state`` and ``load_pct`` per provider, sorted by node then provider."""
    rows = sorted(
        (
            _row(row, snapshot.get("gate", {}), snapshot.get("ttft"))
            for row in snapshot["providers"]
        ),
        key=lambda row: (row["node_id"], row["provider_id"]),
    )
    counts = Counter(row["state"] for row in rows)
    return {
        "providers": rows,
        "queue_depth": snapshot["queue_depth"],
        "oldest_wait_ms": snapshot["oldest_wait_ms"],
        "oldest_wait": format_wait(snapshot["oldest_wait_ms"]),
        "counts": {state: counts.get(state, 0) for state in STATES},
        "generated_at": time.time(),
        "ttft_window_min": round(TTFT_WINDOW_S / 60),
        "groups": [
            {
                "id": gid,
                "queued": g["queued"],
                "eta": format_eta(g["eta_ms"]),
                "affinity": f"{g.get('affinity_hits', 0)} / {g.get('affinity_misses', 0)}",
            }
            for gid, g in sorted(snapshot.get("groups", {}).items())
        ],
    }


def format_eta(ms: int | None) -> str:
    """A group's estimated wait (R-QUEUE-3): "none" when a slot is free, "unknown" before
    any lease of its providers was measured."""
    if ms is None:
        return "unknown"
    return "none" if ms == 0 else format_wait(ms)


class ProviderStatusSerializer(serializers.Serializer):
    node_id = serializers.CharField()
    provider_id = serializers.CharField()
    online = serializers.BooleanField()
    capacity = serializers.IntegerField()
    long_capacity = serializers.IntegerField()
    in_flight = serializers.IntegerField()
    long_in_flight = serializers.IntegerField()
    queued = serializers.IntegerField(help_text="pending requests that list this provider")
    priority = serializers.IntegerField()
    enabled = serializers.BooleanField()
    unavailable = serializers.CharField(
        allow_null=True, help_text="why its Node refused to run it (R-TLS-3), else null"
    )
    health = serializers.ChoiceField(
        choices=["healthy", "ejected", "probing"], help_text="R-HEALTH-4"
    )
    health_reason = serializers.CharField(help_text="why it is not healthy; no address")
    ejected_for_s = serializers.FloatField(help_text="time left of an ejection, 0 otherwise")
    consecutive_failures = serializers.IntegerField(
        help_text="failures before the first byte in a row"
    )


class PoolSnapshotSerializer(serializers.Serializer):
    providers = ProviderStatusSerializer(many=True)
    queue_depth = serializers.IntegerField()
    oldest_wait_ms = serializers.FloatField()
    gate = serializers.DictField(
        child=serializers.DictField(child=serializers.IntegerField()),
        help_text="Stream Evidence Gate outcomes per provider id: fired, recovered, "
        "exhausted, observed (R-SEG-6, R-SEG-8)",
    )
    ttft = serializers.DictField(
        child=serializers.DictField(child=serializers.FloatField()),
        help_text="time to first token of streamed requests per provider id over the last "
        "5 minutes: p50_ms, p95_ms, count (R-OBS-3); providers without samples absent",
    )
    revision = serializers.IntegerField(
        allow_null=True, help_text="the config revision this Edge runs (R-SCALE-3)"
    )
    credential_table = serializers.DictField(
        required=False,
        help_text="managed mode only: the route table in use (version, routes, slots)",
    )


class PoolSnapshotView(APIView):
    """GET /api/pool/: the pool snapshot, exactly as the engine reports it (R-POOL-8)."""

    permission_classes = [IsAdminUser]

    @extend_schema(responses=PoolSnapshotSerializer, summary="Pool snapshot")
    def get(self, request: Request) -> Response | JsonResponse:
        try:
            return Response(read_snapshot())
        except PoolBackendUnavailable:
            return unavailable()


def _status_page(request: HttpRequest) -> HttpResponse:
    try:
        snapshot = read_snapshot()
    except PoolBackendUnavailable:
        return unavailable()
    context = {
        **admin.site.each_context(request),
        "title": "Pool status",
        "status": status_view(snapshot),
        "states": STATES,
        "poll_interval_ms": POLL_INTERVAL_MS,
    }
    return TemplateResponse(request, "admin/pool_status.html", context)


def _status_json(request: HttpRequest) -> JsonResponse:
    try:
        return JsonResponse(status_view(read_snapshot()))
    except PoolBackendUnavailable:
        return unavailable()


# Staff only, never cached; a signed-out browser is sent to the admin login.
status_page = admin.site.admin_view(_status_page)
status_json = admin.site.admin_view(_status_json)
