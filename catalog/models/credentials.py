"""Managed-mode credentials (R-MGD-1..3, R-MGD-6): sealed slots and routes.

These rows are not part of the config document: they never enter a revision, an export or
the snapshot. A slot holds its provider secret only sealed (``catalog.keyring``); a route
holds only the sha256 of its key. docs/credentials.md.
"""

from __future__ import annotations

from django.db import models


class CredentialSlot(models.Model):
    """One provider secret, sealed at rest under the keyring, bound to one profile (R-MGD-2, 6)."""

    key = models.CharField("id", max_length=100, unique=True)
    profile = models.CharField(
        max_length=100, help_text="The protocol profile this secret is for (its family is bound)."
    )
    sealed = models.TextField(editable=False, help_text="AES-256-GCM under the keyring.")
    credential_revision = models.PositiveIntegerField(default=0, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("key",)
        verbose_name = "credential slot"

    def __str__(self) -> str:
        return self.key


class Route(models.Model):
    """The caller's credential in managed mode: a route key bound to a model group (R-MGD-3)."""

    key = models.CharField("id", max_length=100, unique=True)
    model_group = models.CharField(max_length=200)
    key_hash_sha256 = models.CharField(max_length=64, unique=True, editable=False)
    principal_ref = models.CharField(
        max_length=100, blank=True, help_text="Metering label; the route id when blank."
    )
    enabled = models.BooleanField(default=True)
    revision = models.PositiveIntegerField(default=1, editable=False)

    class Meta:
        ordering = ("key",)

    def __str__(self) -> str:
        return self.key


class RouteSlot(models.Model):
    """Which slot a route uses for a provider id, or for every provider of a profile."""

    route = models.ForeignKey(Route, on_delete=models.CASCADE, related_name="slots")
    target = models.CharField(max_length=100, help_text="A provider id or a profile name.")
    slot = models.ForeignKey(CredentialSlot, on_delete=models.PROTECT, related_name="routes")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=("route", "target"), name="route_slot_target_unique")
        ]

    def __str__(self) -> str:
        return f"{self.target}={self.slot.key}"
