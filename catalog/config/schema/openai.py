"""The ``openai`` section: ingress, caller auth, principal tokens and the Stream Evidence Gate."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from catalog.config.schema.base import (
    Amount,
    Doc,
    HeaderName,
    Identifier,
    Label,
    Listen,
    ModelId,
    Secret,
    Sha256Hex,
    fail,
    matching,
)
from catalog.config.schema.sections import ServerTLSDoc

DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
MAX_REQUEST_BYTES_LIMIT = 64 * 1024 * 1024  # the Node reassembles bodies up to this (R-IN-2)
DEFAULT_HEADER_TIMEOUT_S = 15.0
DEFAULT_STREAM_BUFFER_BYTES = 1024 * 1024

# daphne drops inbound header names that contain "_", so the caller-facing header may not.
InboundHeader = Annotated[HeaderName, matching(r"[^_]+", "must not contain '_'")]
AuthScheme = Annotated[str, matching(r"[!#$%&'*+.^_`|~0-9A-Za-z-]*", "must be a single token")]


Limit = Annotated[int, Field(ge=1, le=2**31 - 1)]  # omitted = unlimited; 0 is refused


# R-BUD-1: tokens per UTC calendar period; 0 is refused (to stop a principal, revoke its
# tokens or narrow its ``models``). The bound keeps the figure exact in a 64-bit column.
BUDGET_MAX_TOKENS = 10**15
BudgetPeriod = Literal["day", "week", "month"]


class BudgetDoc(Doc):
    """A principal's budget per UTC calendar period: prompt plus completion ``tokens``
    (R-BUD-1), or an ``amount`` of ``metering.currency`` (R-COST-3); exactly one."""

    tokens: Annotated[int, Field(ge=1, le=BUDGET_MAX_TOKENS)] | None = None
    amount: Amount | None = None
    period: BudgetPeriod

    @model_validator(mode="after")
    def _one_unit(self) -> BudgetDoc:
        if (self.tokens is None) == (self.amount is None):
            raise fail("a budget states exactly one of tokens or amount")
        return self


class PrincipalTokenDoc(Doc):
    """One caller token known by its sha256 only (R-CFG-12), with its policy (R-PRIN-1..3)."""

    token_ref: Identifier
    token_hash_sha256: Sha256Hex
    principal_ref: Label
    alias: Label | None = None
    models: Annotated[list[ModelId], Field(min_length=1, max_length=1000)] | None = None
    max_in_flight: Limit | None = None
    rpm: Limit | None = None
    tpm: Limit | None = None
    max_queued: Limit | None = None
    budget: BudgetDoc | None = None  # R-BUD-1, for the whole principal (rules/budgets.py)
    max_pending_bodies: Limit | None = None  # R-LIM-2; omitted = DEFAULT_MAX_PENDING_BODIES


class PrincipalDoc(Doc):
    """``principals[]`` (R-MGD-13): one principal's policy, over all its keys together, in
    both modes; ``id`` is the ``principal_ref`` of its tokens and routes."""

    id: Label
    budget: BudgetDoc | None = None
    rpm: Limit | None = None
    tpm: Limit | None = None
    max_in_flight: Limit | None = None
    max_queued: Limit | None = None


class ProviderAuthDoc(Doc):
    """Legacy caller-supplied provider token forwarding; omitted fields take R-AUTH-2 defaults."""

    enabled: bool = False
    from_header: InboundHeader = "X-IOP-Provider-Authorization"
    target_header: HeaderName = "Authorization"
    scheme: AuthScheme = "Bearer"
    required: bool = True


class StrategyCapsDoc(Doc):
    """Per-strategy recovery caps; an omitted cap is the request total (R-SEG-2)."""

    resample: Annotated[int, Field(ge=0, le=3)] | None = None
    switch_provider: Annotated[int, Field(ge=0, le=3)] | None = None


class StreamFilterDoc(Doc):
    """One filter; ``hold_evidence_runes`` is the look-behind window in characters (R-SEG-3)."""

    type: Literal["repeat_guard"]
    hold_evidence_runes: Annotated[int, Field(ge=1, le=65536)] = 500
    enforcement: Literal["enforce", "observe"] = "enforce"  # R-SEG-8


class StreamEvidenceGateDoc(Doc):
    """``openai.stream_evidence_gate`` (R-SEG-1, R-SEG-2)."""

    enabled: bool = False
    request_fault_recovery: Annotated[int, Field(ge=0, le=3)] = 1
    strategy_caps: StrategyCapsDoc = Field(default_factory=StrategyCapsDoc)
    ingress_snapshot_bytes: Annotated[int, Field(ge=1, le=16777216)] = 1048576
    filters: list[StreamFilterDoc] = Field(default_factory=list)


class OpenAIDoc(Doc):
    """``openai``: the OpenAI-compatible ingress."""

    enabled: bool = True
    listen: Listen = "127.0.0.1:8080"
    tls: ServerTLSDoc | None = None
    long_context_threshold_tokens: Annotated[int, Field(gt=0)] = 100000
    max_request_bytes: Annotated[int, Field(ge=1024, le=MAX_REQUEST_BYTES_LIMIT)] = (
        DEFAULT_MAX_REQUEST_BYTES
    )
    header_timeout_s: Annotated[float, Field(gt=0, le=300)] = DEFAULT_HEADER_TIMEOUT_S
    stream_buffer_bytes: Annotated[int, Field(ge=65536, le=MAX_REQUEST_BYTES_LIMIT)] = (
        DEFAULT_STREAM_BUFFER_BYTES
    )
    bearer_token: Secret | None = None
    metrics_token: Secret | None = None
    principal_tokens: list[PrincipalTokenDoc] = Field(default_factory=list)
    provider_auth: ProviderAuthDoc = Field(default_factory=ProviderAuthDoc)
    stream_evidence_gate: StreamEvidenceGateDoc = Field(default_factory=StreamEvidenceGateDoc)
