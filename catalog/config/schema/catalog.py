"""Catalog sections: protocol profile overlays, nodes with providers, model groups."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from catalog.config.schema.base import (
    Doc,
    EnvName,
    FileRef,
    HeaderName,
    HttpUrl,
    Identifier,
    JsonObject,
    Label,
    ModelId,
    NonEmpty,
    Price,
    Secret,
    Sha256Hex,
)

DriverName = Literal["openai_chat", "anthropic_messages", "openai_responses", "ollama", "cli"]
CapabilityName = Literal[
    "messages", "chat", "responses", "streaming", "tool_calling", "count_tokens", "models"
]
LegacyType = Literal["openai_compat", "cli", "ollama", "seulgivibe_claude", "seulgivibe_openai"]
PositiveMs = Annotated[int, Field(ge=1)]


class AuthDoc(Doc):
    """An overlay of ``auth``: omitted fields are inherited from the base profile."""

    type: Literal["none", "bearer", "header"] | None = None
    header: HeaderName | None = None
    scheme: str | None = None


class ProfileDoc(Doc):
    """``protocol_profiles.<name>``: an overlay; omitted fields come from ``base`` (R-PROF-1)."""

    base: Identifier | None = None
    driver: DriverName | None = None
    base_url: HttpUrl | None = None
    operations: dict[Identifier, NonEmpty] | None = None
    auth: AuthDoc | None = None
    capabilities: list[CapabilityName] | None = None
    model_mapping: dict[NonEmpty, NonEmpty] | None = None
    extensions: JsonObject | None = None


class PriceDoc(Doc):
    """``price`` of a model group or a provider (R-COST-1): ``metering.currency`` per million
    tokens; ``cached_input`` omitted = the ``input`` price."""

    input: Price
    output: Price
    cached_input: Price | None = None


class ProviderDoc(Doc):
    """``nodes[].providers[]``: one provider resource (R-CFG-3, R-CFG-8)."""

    id: Identifier
    profile: Identifier | None = None
    type: LegacyType | None = None
    label: Label | None = None
    base_url: HttpUrl | None = None
    capacity: Annotated[int, Field(ge=1)] = 1
    long_context_capacity: Annotated[int, Field(ge=0)] = 0
    context_window_tokens: Annotated[int, Field(ge=1)] | None = None
    priority: int = 100
    enabled: bool = True
    command: Annotated[list[NonEmpty], Field(min_length=1)] | None = None
    credential: Secret | None = None
    headers: dict[HeaderName, str] | None = None
    env: dict[EnvName, Secret] | None = None
    # R-MGD-11: cli providers in managed mode; the slot secret's environment variable.
    credential_env: EnvName | None = None
    first_byte_timeout_ms: PositiveMs = 60000
    idle_timeout_ms: PositiveMs = 120000
    run_timeout_ms: PositiveMs | None = None
    concurrency: Annotated[int, Field(ge=0)] | None = None  # R-CFG-13: metadata only
    # R-HEALTH-3: active probes; omitted or 0 = off.
    probe_interval_s: Annotated[float, Field(ge=0, le=86400)] | None = None
    probe_command: Annotated[list[NonEmpty], Field(min_length=1)] | None = None
    price: PriceDoc | None = None  # R-COST-1: wins over the model group's
    # Legacy per-provider queue keys, promoted to provider_pool at load (R-CFG-7).
    max_queue: Annotated[int, Field(ge=0)] | None = None
    queue_timeout_ms: Annotated[int, Field(ge=0)] | None = None


class CredentialRecipientDoc(Doc):
    """``nodes[].credential_recipient``: the Node's X25519 public key (R-MGD-4)."""

    key_id: Identifier
    public_key_file: FileRef


class NodeDoc(Doc):
    """``nodes[]`` without its providers, which are validated one by one."""

    id: Identifier
    alias: Label | None = None
    token_hash_sha256: Sha256Hex
    credential_recipient: CredentialRecipientDoc | None = None
    # R-CFG-13: the legacy NodeRuntimeConfig.concurrency, metadata only (never a node-wide
    # admission limit).
    concurrency: Annotated[int, Field(ge=0)] | None = None
    providers: list[Any] = Field(default_factory=list)


MAX_FALLBACKS = 16  # R-FALL-2: groups in a chain, the group's own list and every one it reaches


class TranslateDoc(Doc):
    """``models[].translate`` as an object: translation on, with what it does with a field
    it would drop (R-XLATE-5): ``drop`` (named in ``x-iop-dropped``) or ``refuse`` (400)."""

    unsupported: Literal["drop", "refuse"] = "drop"


class AffinityDoc(Doc):
    """``models[].affinity`` (R-AFF-1): which request field keys a conversation, and how long
    the provider that last ran it stays preferred."""

    key: Literal["prompt_cache_key", "user", "prefix"]
    ttl_s: Annotated[int, Field(ge=1, le=86400)] = 300


class ModelDoc(Doc):
    """``models[]``: a model group and its provider -> served model mapping (R-CFG-1, 2, 4)."""

    id: ModelId
    usage_attribution: Literal["provider", "model_group"] = "provider"
    providers: Annotated[dict[NonEmpty, NonEmpty], Field(min_length=1)]
    # R-XLATE-1: serve operations a driver lacks by translation; an object turns it on with
    # its R-XLATE-5 setting
    translate: bool | TranslateDoc = False
    affinity: AffinityDoc | None = None  # R-AFF-1: cache affinity inside exact capacity
    # R-LIM-5: larger output bounds are capped to it, a missing one set to it; omitted = none
    max_output_tokens: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = None
    price: PriceDoc | None = None  # R-COST-1: a provider's own price wins
    # R-FALL-1: model groups tried in order when this one cannot serve (rules/fallbacks.py)
    fallbacks: Annotated[list[ModelId], Field(max_length=MAX_FALLBACKS)] = Field(
        default_factory=list
    )
