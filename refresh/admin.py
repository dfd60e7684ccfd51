"""Django admin for config revisions: create from the catalog, dry-run as a table, apply, stage.

Revisions are history: read-only here, never deleted. Every button calls one function of
``refresh.services``; a dry-run is a GET because it changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST

from refresh import services
from refresh.models import ConfigRevision
from refresh.permissions import may
from refresh.report import values_text


def report_html(report: dict[str, Any]) -> SafeString:
    """The report as readable tables, each changed path with ``old → new`` (values are
    autoescaped by the template; secret paths read "changed", docs/refresh.md)."""
    changes = [{**c, "values": values_text(c)} for c in report.get("changes", [])]
    context = {"report": report, "changes": changes}
    return SafeString(render_to_string("refresh/report_table.html", context))


@admin.register(ConfigRevision)
class ConfigRevisionAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "state",
        "is_active",
        "source",
        "author_label",
        "created_at",
        "applied_at",
        "applied_by",
        "summary",
    )
    list_filter = ("state", "is_active", "source")
    search_fields = ("author_label", "applied_by", "digest")
    readonly_fields = (*ConfigRevision.RECORD_FIELDS, "report_table", "document_json")
    fields = readonly_fields
    actions = ("dry_run_selected", "apply_selected", "stage_selected")

    # --- read-only history -----------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # revisions come from the catalog button, the API, /refresh or runedge

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="changes")
    def summary(self, obj: ConfigRevision) -> str:
        report = obj.report or {}
        live = len(report.get("live_paths", []))
        restart = len(report.get("restart_required_paths", []))
        errors = len(report.get("errors", []))
        return f"{live} live, {restart} restart-required" + (
            f", {errors} error(s)" if errors else ""
        )

    @admin.display(description="report")
    def report_table(self, obj: ConfigRevision) -> SafeString:
        return report_html(obj.report or {})

    @admin.display(description="document")
    def document_json(self, obj: ConfigRevision) -> SafeString:
        return format_html("<pre>{}</pre>", json.dumps(obj.document, indent=2))

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict | None = None,
    ) -> HttpResponse:
        context = {
            **(extra_context or {}),
            "show_save": False,
            "show_save_and_continue": False,
            "show_save_and_add_another": False,
            "show_delete": False,
        }
        return super().changeform_view(request, object_id, form_url, context)

    # --- buttons ----------------------------------------------------------------------------

    def get_urls(self) -> list:
        wrap = self.admin_site.admin_view
        own = [
            path("from-catalog/", wrap(self.from_catalog_view), name="refresh_from_catalog"),
            path("<int:pk>/dry-run/", wrap(self.dry_run_view), name="refresh_dry_run"),
            path("<int:pk>/apply/", wrap(self.apply_view), name="refresh_apply"),
            path("<int:pk>/stage/", wrap(self.stage_view), name="refresh_stage"),
        ]
        return own + super().get_urls()

    def from_catalog_view(self, request: HttpRequest) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseRedirect(reverse("admin:refresh_configrevision_changelist"))
        if not may(request.user, "add"):
            raise PermissionDenied
        outcome = services.create_from_catalog(request.user)
        if outcome.revision is None:
            self._errors(request, outcome, "The catalog does not load")
            return HttpResponseRedirect(reverse("admin:refresh_configrevision_changelist"))
        self.message_user(request, f"Created {outcome.revision} from the catalog.")
        return HttpResponseRedirect(reverse("admin:refresh_dry_run", args=[outcome.revision.pk]))

    def dry_run_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        if not may(request.user, "view"):
            raise PermissionDenied
        revision = get_object_or_404(ConfigRevision, pk=pk)
        outcome = services.dry_run(revision.document, services.running_edge(), revision=revision)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Dry-run of {revision}",
            "opts": self.model._meta,
            "revision": revision,
            "report": outcome.body,
            "report_html": report_html(outcome.body),
            "can_change": may(request.user, "change"),
        }
        return TemplateResponse(request, "refresh/dry_run.html", context)

    @staticmethod
    def _revision(request: HttpRequest, pk: int) -> ConfigRevision:
        if not may(request.user, "change"):
            raise PermissionDenied
        return get_object_or_404(ConfigRevision, pk=pk)

    def apply_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        return require_POST(self._apply)(request, pk)

    def stage_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        return require_POST(self._stage)(request, pk)

    def _apply(self, request: HttpRequest, pk: int) -> HttpResponse:
        outcome = services.apply_revision(
            services.running_edge(), self._revision(request, pk), actor=request.user
        )
        self._tell(request, outcome, "Applied")
        return HttpResponseRedirect(reverse("admin:refresh_configrevision_change", args=[pk]))

    def _stage(self, request: HttpRequest, pk: int) -> HttpResponse:
        outcome = services.stage_revision(self._revision(request, pk), actor=request.user)
        self._tell(request, outcome, "Staged for the next start:")
        return HttpResponseRedirect(reverse("admin:refresh_configrevision_change", args=[pk]))

    def _tell(self, request: HttpRequest, outcome: services.Outcome, done: str) -> None:
        body = outcome.body
        if outcome.status != services.OK:
            verb = "Failed" if body["outcome"] == "failed" else "Refused"
            self._errors(request, outcome, f"{verb} ({body['outcome']})")
            return
        pushed = ", ".join(body["pushed_nodes"]) or "no node"
        self.message_user(
            request,
            f"{done} revision {body['revision']}: "
            f"{len(body['live_paths'])} live path(s); pushed to {pushed}.",
        )

    def _errors(self, request: HttpRequest, outcome: services.Outcome, title: str) -> None:
        body = outcome.body
        lines = [f"{e['path']}: {e['message']}" for e in body["errors"]]
        lines += [f"{p}: restart required" for p in body["restart_required_paths"]]
        self.message_user(request, f"{title}. " + "; ".join(lines), messages.ERROR)

    # --- changelist actions (one revision at a time) ----------------------------------------

    def _one(self, request: HttpRequest, queryset: QuerySet) -> ConfigRevision | None:
        if queryset.count() != 1:
            self.message_user(request, "Select exactly one revision.", messages.WARNING)
            return None
        return queryset.first()

    @admin.action(description="Dry-run the selected revision (shows the report)")
    def dry_run_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        revision = self._one(request, queryset)
        if revision is None:
            return None
        return HttpResponseRedirect(reverse("admin:refresh_dry_run", args=[revision.pk]))

    @admin.action(description="Apply the selected revision live", permissions=["change"])
    def apply_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        revision = self._one(request, queryset)
        if revision is not None:
            outcome = services.apply_revision(services.running_edge(), revision, actor=request.user)
            self._tell(request, outcome, "Applied")

    @admin.action(
        description="Stage the selected revision for the next start", permissions=["change"]
    )
    def stage_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        revision = self._one(request, queryset)
        if revision is not None:
            outcome = services.stage_revision(revision, actor=request.user)
            self._tell(request, outcome, "Staged for the next start:")
