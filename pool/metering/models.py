"""The usage ledger: bounded, aggregated rows the meter writes in batches (R-CFG-4, R-AUTH-1)."""

from __future__ import annotations

from django.db import models

from pool.metering.labels import NO_LABEL


class UsageBucket(models.Model):
    """Requests and tokens for one hour and one (principal, token, model group, attribution) key.

    Rows hold references only (principal_ref, token_ref, ids), never a token or a key
    (R-CFG-12, R-REF-6). The meter increments them; operators read them in the admin.
    """

    ATTRIBUTION_CHOICES = (
        ("provider", "provider"),
        ("model_group", "model_group"),
        (NO_LABEL, "unknown"),
    )

    bucket_start = models.DateTimeField(help_text="Start of the hour (UTC) the row counts.")
    principal_ref = models.CharField(max_length=200, default=NO_LABEL)
    token_ref = models.CharField(max_length=200, default=NO_LABEL)
    model_group = models.CharField(max_length=200, default=NO_LABEL)
    attributed_to = models.CharField(
        max_length=200,
        default=NO_LABEL,
        help_text="The provider id, or the model group id when attribution is model_group.",
    )
    attribution = models.CharField(max_length=20, choices=ATTRIBUTION_CHOICES, default="provider")
    estimated = models.BooleanField(
        default=False, help_text="Token figures were estimated by the Edge, not reported upstream."
    )
    requested_group = models.CharField(
        max_length=200,
        default=NO_LABEL,
        help_text="The model group asked of when a fallback group served the requests (R-FALL-1).",
    )
    requests = models.BigIntegerField(default=0)
    errors = models.BigIntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField()

    KEY_FIELDS = (
        "bucket_start",
        "principal_ref",
        "token_ref",
        "model_group",
        "attributed_to",
        "attribution",
        "estimated",
        "requested_group",
    )

    class Meta:
        ordering = ("-bucket_start", "model_group", "attributed_to", "principal_ref", "token_ref")
        constraints = [
            models.UniqueConstraint(
                fields=[
                    "bucket_start",
                    "principal_ref",
                    "token_ref",
                    "model_group",
                    "attributed_to",
                    "attribution",
                    "estimated",
                    "requested_group",
                ],
                name="pool_usage_bucket_key",
            )
        ]
        indexes = [
            models.Index(fields=["model_group", "bucket_start"], name="pool_usage_model"),
            # R-BUD-1: the budget view reads each budgeted principal's period
            models.Index(fields=["principal_ref", "bucket_start"], name="pool_usage_principal"),
        ]

    def __str__(self) -> str:
        return f"{self.bucket_start:%Y-%m-%d %H:00} {self.model_group} -> {self.attributed_to}"
