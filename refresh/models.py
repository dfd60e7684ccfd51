"""Config revisions: every candidate document, its parent, who, when, the report and the outcome.

Exactly one revision is active (a conditional unique constraint): the one the running Edge was
started with or last applied. Revisions are history: rows are never deleted.
"""

from __future__ import annotations

from django.conf import settings
from django.db import connection, models
from django.utils import timezone

# pg_advisory_xact_lock key of "who changes the active revision" (an arbitrary constant).
_REVISION_LOCK_KEY = 0x10_70_5E_F1


def active_for_change() -> ConfigRevision | None:
    """Inside a transaction: wait until no other process (any Edge on this database) is
    changing the active revision, then read it, locked until commit.

    ``SELECT ... WHERE is_active FOR UPDATE`` alone is not enough on PostgreSQL: the second of
    two concurrent applies waits on the old active row, then finds it no longer active and
    reads no active revision at all. The advisory lock comes first, so the read that follows
    sees the winner's commit (R-SCALE-3, docs/refresh.md). SQLite needs none: its
    transactions take the write lock when they begin (settings: IMMEDIATE).
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_REVISION_LOCK_KEY])
    return ConfigRevision.objects.select_for_update().filter(is_active=True).first()


class ConfigRevision(models.Model):
    """One whole config document as JSON, with its lineage and outcome."""

    class State(models.TextChoices):
        DRAFT = "draft", "draft"
        APPLIED = "applied", "applied"
        REFUSED = "refused", "refused"
        STAGED = "staged", "staged for restart"
        FAILED = "failed", "failed to install"

    class Source(models.TextChoices):
        CATALOG = "catalog", "catalog"
        DOCUMENT = "document", "document"
        REFRESH = "refresh", "POST /refresh"
        CONFIG_FILE = "config_file", "config file"

    document = models.JSONField(help_text="The whole config document, canonical form.")
    digest = models.CharField(
        max_length=64, db_index=True, help_text="sha256 of the canonical document."
    )
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="children",
        help_text="The revision that was active when this one was created.",
    )
    source = models.CharField(max_length=16, choices=Source.choices)
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    author_label = models.CharField(
        max_length=200, help_text="Who created it: a username, POST /refresh or the command."
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.DRAFT)
    is_active = models.BooleanField(default=False, editable=False)
    report = models.JSONField(default=dict, blank=True, help_text="The last classification report.")
    applied_at = models.DateTimeField(null=True, blank=True)
    applied_by = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_active"],
                condition=models.Q(is_active=True),
                name="refresh_one_active_revision",
            )
        ]

    # What a revision's record shows (admin and REST API): lineage, who, when, state.
    RECORD_FIELDS = (
        "id",
        "state",
        "is_active",
        "parent",
        "source",
        "author_label",
        "created_at",
        "applied_at",
        "applied_by",
        "digest",
    )

    def mark_active(self, replacing: ConfigRevision | None, by: str) -> None:
        """Take over from the active revision (saved); the caller saves this one."""
        if replacing is not None:
            replacing.is_active = False
            replacing.save(update_fields=["is_active"])
        self.state = self.State.APPLIED
        self.is_active = True
        self.applied_at = timezone.now()
        self.applied_by = by

    def mark_failed(self, previous: ConfigRevision | None) -> None:
        """The running Edge could not install this revision: ``previous`` (the revision it
        keeps running) is active again. Both rows are saved, this one first (one active)."""
        self.state = self.State.FAILED
        self.is_active = False
        self.applied_at = None
        self.applied_by = ""
        self.save(update_fields=["state", "is_active", "applied_at", "applied_by"])
        if previous is not None:
            previous.is_active = True
            previous.save(update_fields=["is_active"])

    def __str__(self) -> str:
        active = ", active" if self.is_active else ""
        return f"revision {self.pk} ({self.get_state_display()}{active})"
