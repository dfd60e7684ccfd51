"""Read-only admin for the usage ledger: the meter writes it, operators filter and read it."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from catalog.config.money import pico_text
from pool.models import RequestLogEntry, UsageBucket


@admin.display(description="cost", ordering="cost_pico")
def cost(row: UsageBucket | RequestLogEntry) -> str:
    """R-COST-2: the row's cost in metering.currency, exact (``*`` when it was estimated)."""
    return pico_text(row.cost_pico) + (" *" if row.estimated else "")


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows the meter writes: operators read and filter them, never add, change or delete."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(UsageBucket)
class UsageBucketAdmin(ReadOnlyAdmin):
    list_display = (
        "bucket_start",
        "model_group",
        "attributed_to",
        "attribution",
        "principal_ref",
        "token_ref",
        "estimated",
        "requested_group",
        "requests",
        "errors",
        "input_tokens",
        "output_tokens",
        "cached_input_tokens",
        cost,
    )
    list_filter = (
        "model_group",
        "attributed_to",
        "attribution",
        "principal_ref",
        "token_ref",
        "estimated",
        "requested_group",
        "bucket_start",
    )
    search_fields = ("model_group", "attributed_to", "principal_ref", "token_ref")
    date_hierarchy = "bucket_start"
    list_per_page = 100
    readonly_fields = [field.name for field in UsageBucket._meta.fields]


@admin.register(RequestLogEntry)
class RequestLogEntryAdmin(ReadOnlyAdmin):
    """The request log (R-OBS-1): search by the request id a caller got in ``x-request-id``."""

    list_display = (
        "at",
        "request_id",
        "model_group",
        "requested_group",
        "provider",
        "node",
        "principal_ref",
        "status",
        "code",
        "input_tokens",
        "output_tokens",
        "cached_input_tokens",
        cost,
        "queue_wait_ms",
        "ttft_ms",
        "duration_ms",
    )
    list_filter = ("code", "model_group", "requested_group", "provider", "principal_ref",
                   "stream", "at")  # fmt: skip
    search_fields = ("=request_id", "=trace_id")
    date_hierarchy = "at"
    list_per_page = 100
    show_full_result_count = False  # a large table: no COUNT(*) per page
    readonly_fields = [field.name for field in RequestLogEntry._meta.fields]
