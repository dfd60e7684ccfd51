"""Django admin for the catalog. Every save or delete is validated on the whole candidate catalog.

The edit runs inside a transaction; the catalog is then loaded as the config loader would load
it, and on any issue the transaction is rolled back and the form is shown again with every
`path: message` line (R-CFG-5: nothing half-applied).
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db import transaction
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

import catalog.admin_credentials  # noqa: F401  (registers the credential pages)
from catalog.config import ConfigError
from catalog.documents import validate_catalog
from catalog.forms import CatalogForm, PrincipalTokenForm, issue_lines, rejecting
from catalog.models import (
    EdgeSettings,
    ModelGroup,
    ModelProvider,
    Node,
    PrincipalToken,
    ProtocolProfile,
    Provider,
)


class CatalogRejected(Exception):
    """The candidate catalog does not load; carries its `path: message` lines."""

    def __init__(self, lines: tuple[str, ...]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def check_candidate() -> None:
    """Validate the catalog as it stands inside the current transaction."""
    try:
        validate_catalog()
    except ConfigError as exc:
        raise CatalogRejected(issue_lines(exc)) from None


class CatalogAdmin(admin.ModelAdmin):
    """Saves and deletes are kept only when the whole resulting catalog loads."""

    form = CatalogForm

    def get_form(self, request: HttpRequest, obj=None, change: bool = False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        lines = getattr(request, "catalog_rejection", None)
        return rejecting(form, lines) if lines else form

    def save_related(self, request: HttpRequest, form, formsets, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        check_candidate()  # after the inlines: the candidate is the object with its children

    def delete_model(self, request: HttpRequest, obj) -> None:
        super().delete_model(request, obj)
        check_candidate()

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        super().delete_queryset(request, queryset)
        check_candidate()

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        try:
            with transaction.atomic():
                return super().changeform_view(request, object_id, form_url, extra_context)
        except CatalogRejected as exc:
            # Render the same POST again; the form now fails with the loader's issues.
            request.catalog_rejection = exc.lines
            return super().changeform_view(request, object_id, form_url, extra_context)

    def delete_view(self, request, object_id, extra_context=None) -> HttpResponse:
        try:
            with transaction.atomic():
                return super().delete_view(request, object_id, extra_context)
        except CatalogRejected as exc:
            self.refuse(request, exc)
            opts = self.opts
            url = reverse(
                f"admin:{opts.app_label}_{opts.model_name}_change",
                args=[object_id],
                current_app=self.admin_site.name,
            )
            return HttpResponseRedirect(url)

    def changelist_view(self, request, extra_context=None) -> HttpResponse:
        try:
            with transaction.atomic():  # bulk delete action: its log entries roll back too
                return super().changelist_view(request, extra_context)
        except CatalogRejected as exc:
            self.refuse(request, exc)
            return HttpResponseRedirect(request.get_full_path())

    def refuse(self, request: HttpRequest, exc: CatalogRejected) -> None:
        self.message_user(request, "Refused: the catalog would not load.", messages.ERROR)
        for line in exc.lines:
            self.message_user(request, line, messages.ERROR)


@admin.register(ProtocolProfile)
class ProtocolProfileAdmin(CatalogAdmin):
    list_display = ("name", "base", "driver", "base_url", "order")
    list_filter = ("driver", "base")
    search_fields = ("name", "base", "base_url")
    fields = ("name", "base", "driver", "base_url", "settings", "order")


class ProviderInline(admin.StackedInline):
    model = Provider
    form = CatalogForm
    extra = 0
    fields = (
        ("key", "enabled"),
        ("profile", "legacy_type"),
        ("capacity", "long_context_capacity"),
        ("context_window_tokens", "priority"),
        "price",
        "settings",
        "order",
    )


@admin.register(Node)
class NodeAdmin(CatalogAdmin):
    list_display = ("key", "alias", "provider_count", "has_token", "order")
    search_fields = ("key", "alias", "providers__key")
    fields = ("key", "alias", "token_hash_sha256", "settings", "order")
    inlines = (ProviderInline,)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).annotate(n_providers=Count("providers"))

    @admin.display(description="providers", ordering="n_providers")
    def provider_count(self, obj: Node) -> int:
        return obj.n_providers

    @admin.display(description="token hash", boolean=True)
    def has_token(self, obj: Node) -> bool:
        return bool(obj.token_hash_sha256)


@admin.register(Provider)
class ProviderAdmin(CatalogAdmin):
    list_display = (
        "key",
        "node",
        "profile",
        "legacy_type",
        "capacity",
        "long_context_capacity",
        "priority",
        "enabled",
    )
    list_filter = ("enabled", "node", "profile", "legacy_type")
    list_select_related = ("node",)
    search_fields = ("key", "profile", "legacy_type", "node__key", "node__alias")
    fields = (
        ("node", "key", "enabled"),
        ("profile", "legacy_type"),
        ("capacity", "long_context_capacity"),
        ("context_window_tokens", "priority"),
        "price",
        "settings",
        "order",
    )


class ModelProviderInline(admin.TabularInline):
    model = ModelProvider
    form = CatalogForm
    extra = 0
    fields = ("provider", "served_model", "order")


@admin.register(ModelGroup)
class ModelGroupAdmin(CatalogAdmin):
    list_display = ("key", "usage_attribution", "targets_display", "order")
    list_filter = ("usage_attribution", "targets__provider__node", "targets__provider")
    search_fields = ("key", "targets__provider__key", "targets__served_model")
    fields = ("key", "usage_attribution", "fallbacks", "price", "settings", "order")
    inlines = (ModelProviderInline,)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).prefetch_related("targets__provider")

    @admin.display(description="providers")
    def targets_display(self, obj: ModelGroup) -> str:
        return ", ".join(str(target) for target in obj.targets.all())


@admin.register(PrincipalToken)
class PrincipalTokenAdmin(CatalogAdmin):
    form = PrincipalTokenForm
    list_display = (
        "token_ref",
        "principal_ref",
        "alias",
        "hash_prefix",
        "scope_display",
        "max_in_flight",
        "rpm",
        "tpm",
        "max_queued",
        "budget",
        "order",
    )
    list_filter = ("principal_ref",)
    search_fields = ("token_ref", "principal_ref", "alias")
    fieldsets = (
        (None, {"fields": ("token_ref", "principal_ref", "alias", "token_hash_sha256")}),
        (
            "policy (R-PRIN-1..3, R-BUD-1, live)",
            {
                "fields": (
                    "model_groups",
                    ("max_in_flight", "max_queued"),
                    ("rpm", "tpm"),
                    "budget",
                )
            },
        ),
        (None, {"fields": ("settings", "order")}),
    )

    @admin.display(description="models")
    def scope_display(self, obj: PrincipalToken) -> str:
        return ", ".join(obj.model_groups) if obj.model_groups else "all"

    @admin.display(description="sha256")
    def hash_prefix(self, obj: PrincipalToken) -> str:
        return f"{obj.token_hash_sha256[:12]}…"


@admin.register(EdgeSettings)
class EdgeSettingsAdmin(CatalogAdmin):
    list_display = ("__str__", "edge_listen", "openai_listen", "admin_listen")
    fieldsets = (
        ("edge", {"fields": ("edge_id", "edge_listen", "edge_bootstrap_dir", "edge_tls")}),
        ("admin", {"fields": ("admin_listen",)}),
        (
            "openai",
            {
                "fields": (
                    "openai_enabled",
                    "openai_listen",
                    "openai_tls",
                    "long_context_threshold_tokens",
                    "max_request_bytes",
                    "bearer_token",
                    "metrics_token",
                    "provider_auth",
                    "stream_evidence_gate",
                )
            },
        ),
        ("provider_pool", {"fields": ("max_queue", "queue_timeout_ms")}),
        ("credential_plane", {"fields": ("credential_plane_enabled",)}),
        (
            "other keys",
            {
                "classes": ("collapse",),
                "fields": (
                    "edge_extra",
                    "admin_extra",
                    "openai_extra",
                    "provider_pool_extra",
                    "credential_plane_extra",
                    "other_sections",
                ),
            },
        ),
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return not EdgeSettings.objects.exists() and super().has_add_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False  # one row, edited in place; blank fields already mean the defaults
