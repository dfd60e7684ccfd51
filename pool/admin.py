"""Read-only admin for the usage ledger: the meter writes it, operators filter and read it."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from pool.models import UsageBucket


@admin.register(UsageBucket)
class UsageBucketAdmin(admin.ModelAdmin):
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

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
