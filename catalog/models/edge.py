"""The one row of Edge-wide settings (the document's top-level sections)."""

from __future__ import annotations

from typing import ClassVar

from django.core.exceptions import ValidationError
from django.db import models

from catalog.models.base import DocumentJSONField, settings_problem


class EdgeSettings(models.Model):
    """The one row of Edge-wide sections: edge, admin, openai, provider_pool, credential_plane."""

    SINGLETON_PK = 1

    # edge
    edge_id = models.CharField("edge.id", max_length=100, blank=True)
    edge_listen = models.CharField("edge.listen", max_length=200, blank=True)
    edge_bootstrap_dir = models.CharField("edge.bootstrap_dir", max_length=500, blank=True)
    edge_tls = DocumentJSONField("edge.tls", null=True, blank=True)
    edge_extra = DocumentJSONField("other edge keys", default=dict, blank=True)
    # admin
    admin_listen = models.CharField("admin.listen", max_length=200, blank=True)
    admin_extra = DocumentJSONField("other admin keys", default=dict, blank=True)
    # openai (principal_tokens live in their own table)
    openai_enabled = models.BooleanField("openai.enabled", null=True, blank=True)
    openai_listen = models.CharField("openai.listen", max_length=200, blank=True)
    openai_tls = DocumentJSONField("openai.tls", null=True, blank=True)
    long_context_threshold_tokens = models.IntegerField(
        "openai.long_context_threshold_tokens", null=True, blank=True
    )
    max_request_bytes = models.IntegerField("openai.max_request_bytes", null=True, blank=True)
    bearer_token = DocumentJSONField(
        "openai.bearer_token", null=True, blank=True, help_text='A reference: {"env": "NAME"}.'
    )
    metrics_token = DocumentJSONField(
        "openai.metrics_token", null=True, blank=True, help_text='A reference: {"env": "NAME"}.'
    )
    provider_auth = DocumentJSONField("openai.provider_auth", null=True, blank=True)
    stream_evidence_gate = DocumentJSONField("openai.stream_evidence_gate", null=True, blank=True)
    openai_extra = DocumentJSONField("other openai keys", default=dict, blank=True)
    # provider_pool
    max_queue = models.IntegerField("provider_pool.max_queue", null=True, blank=True)
    queue_timeout_ms = models.IntegerField("provider_pool.queue_timeout_ms", null=True, blank=True)
    provider_pool_extra = DocumentJSONField("other provider_pool keys", default=dict, blank=True)
    # credential_plane
    credential_plane_enabled = models.BooleanField(
        "credential_plane.enabled", null=True, blank=True
    )
    credential_plane_extra = DocumentJSONField(
        "other credential_plane keys", default=dict, blank=True
    )
    control_plane = DocumentJSONField(
        "credential_plane.control_plane",
        null=True,
        blank=True,
        help_text="The managed-mode control-plane connector.",
    )
    # any other top-level section, kept as written
    other_sections = DocumentJSONField(default=dict, blank=True)

    # section -> {document key -> column}; then each section's JSON column for other keys.
    sections: ClassVar[dict[str, dict[str, str]]] = {
        "edge": {
            "id": "edge_id",
            "listen": "edge_listen",
            "bootstrap_dir": "edge_bootstrap_dir",
            "tls": "edge_tls",
        },
        "admin": {"listen": "admin_listen"},
        "openai": {
            "enabled": "openai_enabled",
            "listen": "openai_listen",
            "tls": "openai_tls",
            "long_context_threshold_tokens": "long_context_threshold_tokens",
            "max_request_bytes": "max_request_bytes",
            "bearer_token": "bearer_token",
            "metrics_token": "metrics_token",
            "provider_auth": "provider_auth",
            "stream_evidence_gate": "stream_evidence_gate",
        },
        "provider_pool": {"max_queue": "max_queue", "queue_timeout_ms": "queue_timeout_ms"},
        "credential_plane": {
            "enabled": "credential_plane_enabled",
            "control_plane": "control_plane",
        },
    }
    section_extras: ClassVar[dict[str, str]] = {
        "edge": "edge_extra",
        "admin": "admin_extra",
        "openai": "openai_extra",
        "provider_pool": "provider_pool_extra",
        "credential_plane": "credential_plane_extra",
    }
    section_children: ClassVar[dict[str, frozenset[str]]] = {
        "openai": frozenset({"principal_tokens"})
    }
    # Top-level keys held by the other tables.
    table_sections: ClassVar[frozenset[str]] = frozenset({"protocol_profiles", "nodes", "models"})

    class Meta:
        verbose_name = "Edge settings"
        verbose_name_plural = "Edge settings"

    def save(self, *args, **kwargs) -> None:
        self.pk = self.SINGLETON_PK  # one row, always (R-CFG: one Edge per catalog)
        super().save(*args, **kwargs)

    def clean(self) -> None:
        super().clean()
        errors: dict[str, str] = {}
        for section, extra_field in self.section_extras.items():
            problem = settings_problem(
                getattr(self, extra_field),
                self,
                self.sections[section],
                self.section_children.get(section, frozenset()),
            )
            if problem:
                errors[extra_field] = problem
        known = self.table_sections | self.sections.keys()
        problem = settings_problem(self.other_sections, self, {}, frozenset(known))
        if problem:
            errors["other_sections"] = problem
        if errors:
            raise ValidationError(errors)

    def __str__(self) -> str:
        return f"Edge {self.edge_id or '(no id)'}"
