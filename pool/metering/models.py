"""The usage ledger: bounded, aggregated rows the meter writes in batches (R-CFG-4, R-AUTH-1)."""

from __future__ import annotations

from django.db import models

from pool.metering.labels import NO_LABEL

CACHED_HELP = "Of the input tokens, those the upstream read from its prompt cache (R-COST-1)."
COST_HELP = (
    "Cost in 10^-12 of metering.currency (R-COST-2): exact, summed as integers; "
    "estimated when the row is (docs/metering.md, 'Spend')."
)


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
        default=False,
        help_text="Token figures (and so the cost) were estimated by the Edge, not reported "
        "upstream.",
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
    cached_input_tokens = models.BigIntegerField(default=0, help_text=CACHED_HELP)
    cost_pico = models.BigIntegerField(default=0, help_text=COST_HELP)
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


class RequestLogEntry(models.Model):
    """One finished ``/v1`` request, found by its request id (R-OBS-1, docs/metering.md).

    Written by the meter in batches, kept ``IOP_REQUEST_LOG_RETENTION_DAYS``; labels are the
    meter's bounded ones (configured ids and refs, else ``-``), never caller text.
    """

    request_id = models.CharField(max_length=128, db_index=True)
    at = models.DateTimeField(db_index=True, help_text="When the request ended (UTC).")
    trace_id = models.CharField(max_length=32, blank=True, help_text="OpenTelemetry trace id.")
    operation = models.CharField(max_length=48)
    principal_ref = models.CharField(max_length=200, default=NO_LABEL)
    token_ref = models.CharField(max_length=200, default=NO_LABEL)
    model_group = models.CharField(
        max_length=200, default=NO_LABEL, help_text="The model group that served the request."
    )
    requested_group = models.CharField(
        max_length=200,
        default=NO_LABEL,
        help_text="The model group asked of when a fallback group served the request (R-FALL-1).",
    )
    provider = models.CharField(max_length=200, default=NO_LABEL)
    node = models.CharField(max_length=200, blank=True)
    status = models.PositiveSmallIntegerField(help_text="The HTTP status the caller got.")
    code = models.CharField(max_length=64, help_text="ok, or the error code.")
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cached_input_tokens = models.BigIntegerField(default=0, help_text=CACHED_HELP)
    cost_pico = models.BigIntegerField(default=0, help_text=COST_HELP)
    estimated = models.BooleanField(default=False, help_text="Tokens and cost were estimated.")
    stream = models.BooleanField(default=False)
    queue_wait_ms = models.FloatField(null=True, blank=True)
    ttft_ms = models.FloatField(null=True, blank=True, help_text="Streams: time to first token.")
    duration_ms = models.FloatField()

    ROW_FIELDS = (
        "request_id", "at", "trace_id", "operation", "principal_ref", "token_ref",
        "model_group", "requested_group", "provider", "node", "status", "code", "input_tokens",
        "output_tokens", "cached_input_tokens", "cost_pico",
        "estimated", "stream", "queue_wait_ms", "ttft_ms", "duration_ms",
    )  # fmt: skip

    class Meta:
        ordering = ("-at",)
        verbose_name = "request log entry"
        verbose_name_plural = "request log"

    def __str__(self) -> str:
        return f"{self.request_id} {self.model_group} {self.status}"
