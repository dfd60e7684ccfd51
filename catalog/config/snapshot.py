"""The validated, immutable Edge snapshot that the pool, mapper, HTTP surface and refresh read."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from types import MappingProxyType
from typing import Any, Literal

from catalog.config.addresses import HostPort
from catalog.config.money import DEFAULT_CURRENCY, per_token_pico, to_pico
from catalog.config.profiles.model import RuntimeProfile
from catalog.config.secrets import SecretRef

UsageAttribution = Literal["provider", "model_group"]


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """A server certificate and key, both external file references (R-AUTH-4)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None


@dataclass(frozen=True, slots=True)
class Price:
    """R-COST-1: ``metering.currency`` per million input, output and cached input tokens
    (``cached_input`` already resolved: the input price when it was omitted)."""

    input: Decimal
    output: Decimal
    cached_input: Decimal

    def per_token_pico(self) -> tuple[int, int, int]:
        """(input, output, cached input) in 10^-12 of the currency per token, exact."""
        return (per_token_pico(self.input), per_token_pico(self.output),
                per_token_pico(self.cached_input))  # fmt: skip


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    """One provider resource on a Node: its profile, pool figures and adapter settings."""

    id: str
    node_id: str
    label: str
    profile: RuntimeProfile
    capacity: int = 1
    long_context_capacity: int = 0
    context_window_tokens: int | None = None
    priority: int = 100
    enabled: bool = True
    command: tuple[str, ...] | None = None
    credential: SecretRef | None = None
    headers: Mapping[str, str] = field(default_factory=_empty, hash=False)
    env: Mapping[str, SecretRef] = field(default_factory=_empty, hash=False)
    first_byte_timeout_ms: int = 60000
    idle_timeout_ms: int = 120000
    run_timeout_ms: int | None = None
    concurrency: int | None = None  # R-CFG-13: legacy metadata, never an admission limit
    probe_interval_s: float = 0.0  # R-HEALTH-3: 0 = no active probe
    probe_command: tuple[str, ...] | None = None  # cli providers: the probe program
    credential_env: str | None = None  # managed cli providers: the slot secret's env name
    price: Price | None = None  # R-COST-1: wins over the model group's

    @property
    def address(self) -> str:
        """What the provider is, for health (R-HEALTH-2): a change of it resets health."""
        return f"{self.profile.name}|{self.profile.base_url or ''}|{' '.join(self.command or ())}"

    @property
    def adapter(self) -> str:
        """The Node adapter kind: openai_compat, ollama or cli."""
        return self.profile.adapter

    @property
    def base_url(self) -> str | None:
        """The effective upstream base URL (the provider's own, else the profile's)."""
        return self.profile.base_url

    @property
    def total_context_tokens(self) -> int:
        """R-CFG-8: the static long-context budget, context window times long slots."""
        return (self.context_window_tokens or 0) * self.long_context_capacity


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A Node: identity, token hash and its provider catalog (R-CFG-3)."""

    id: str
    alias: str | None
    token_hash_sha256: str
    providers: tuple[ProviderSpec, ...] = ()
    credential_recipient: KeyFile | None = None  # managed mode: its X25519 public key (R-MGD-4)
    concurrency: int | None = None  # R-CFG-13: legacy metadata, never an admission limit


@dataclass(frozen=True, slots=True)
class Affinity:
    """R-AFF-1: the request field that keys a conversation, and how long it holds."""

    key: str  # prompt_cache_key | user | prefix
    ttl_s: int


@dataclass(frozen=True, slots=True)
class ModelGroupSpec:
    """An external model key and the served model name of each of its providers (R-CFG-1, 2)."""

    id: str
    usage_attribution: UsageAttribution = "provider"
    providers: Mapping[str, str] = field(default_factory=_empty, hash=False)
    translate: bool = False  # R-XLATE-1
    # R-FALL-1: the groups tried after this one, in order: its ``fallbacks`` with each one's
    # own chain after it, each group once (resolved at load; loops are refused there).
    fallbacks: tuple[str, ...] = ()
    # R-XLATE-5: ``translate: {unsupported: refuse}``: what translation would drop is refused
    refuse_dropped: bool = False
    affinity: Affinity | None = None  # R-AFF-1
    max_output_tokens: int | None = None  # R-LIM-5: None = the client's own bound
    price: Price | None = None  # R-COST-1: for providers without their own


@dataclass(frozen=True, slots=True)
class Budget:
    """What a principal may use per UTC calendar period: prompt plus completion ``tokens``
    (R-BUD-1) or an ``amount`` of ``metering.currency`` (R-COST-3); exactly one is set."""

    tokens: int | None
    period: str  # day | week | month
    amount: Decimal | None = None

    @property
    def in_money(self) -> bool:
        return self.amount is not None

    @property
    def limit(self) -> int:
        """The figure the meter's counters are compared with: tokens, or 10^-12 units."""
        return to_pico(self.amount) if self.amount is not None else int(self.tokens or 0)


@dataclass(frozen=True, slots=True)
class PrincipalSpec:
    """R-MGD-13: a principal's policy over all its keys (tokens, route keys) together;
    None = no such limit. The budget is also stated here when a token states it."""

    id: str
    budget: Budget | None = None
    rpm: int | None = None
    tpm: int | None = None
    max_in_flight: int | None = None
    max_queued: int | None = None

    @property
    def limited(self) -> bool:
        """Whether it counts requests (rpm, tpm or in-flight) over its keys."""
        return self.rpm is not None or self.tpm is not None or self.max_in_flight is not None


@dataclass(frozen=True, slots=True)
class PrincipalTokenSpec:
    """A caller token known only by its sha256 (R-CFG-12) and its policy (R-PRIN-1..3).

    ``models`` None means every model group; a limit of None means unlimited.
    """

    token_ref: str
    token_hash_sha256: str
    principal_ref: str
    alias: str | None = None
    models: frozenset[str] | None = None
    max_in_flight: int | None = None
    rpm: int | None = None
    tpm: int | None = None
    max_queued: int | None = None
    budget: Budget | None = None  # R-BUD-1: the principal's (equal on each of its tokens)
    max_pending_bodies: int | None = None  # R-LIM-2: None = the default (pool.http.limits)


@dataclass(frozen=True, slots=True)
class ProviderAuth:
    """Legacy forwarding of a caller-supplied provider token (R-AUTH-2)."""

    enabled: bool = False
    from_header: str = "X-IOP-Provider-Authorization"
    target_header: str = "Authorization"
    scheme: str = "Bearer"
    required: bool = True


@dataclass(frozen=True, slots=True)
class StreamFilter:
    """One Stream Evidence Gate filter (R-SEG-3, R-SEG-8)."""

    type: str
    hold_evidence_runes: int = 500
    enforcement: str = "enforce"  # enforce | observe


@dataclass(frozen=True, slots=True)
class StreamEvidenceGate:
    """Stream Evidence Gate settings; restart-required (R-SEG-1, R-SEG-2)."""

    enabled: bool = False
    request_fault_recovery: int = 1
    strategy_caps: Mapping[str, int] = field(default_factory=_empty, hash=False)
    ingress_snapshot_bytes: int = 1048576
    filters: tuple[StreamFilter, ...] = ()


@dataclass(frozen=True, slots=True)
class KeyFile:
    """A key named by id and held in an external file (R-AUTH-4)."""

    key_id: str
    path: str


@dataclass(frozen=True, slots=True)
class CredentialPlane:
    """Managed credential mode (R-MGD-1..6): the issuer key, the keyring, envelope lifetime."""

    issuer: KeyFile
    keyring_file: str
    envelope_ttl_s: int = 60


@dataclass(frozen=True, slots=True)
class EdgeSnapshot:
    """Everything the running Edge reads, validated as a whole; built only by ``load_snapshot``.

    Read-only mappings are left out of hashing (they are not hashable); equality covers all.
    """

    document_json: str
    edge_id: str
    bootstrap_dir: str
    edge_listen: HostPort
    edge_tls: TLSFiles | None
    admin_listen: HostPort
    admin_token: SecretRef | None  # the control listener's bearer token, when set
    openai_enabled: bool
    openai_listen: HostPort
    openai_tls: TLSFiles | None
    long_context_threshold_tokens: int
    max_request_bytes: int
    header_timeout_s: float
    stream_buffer_bytes: int
    bearer_token: SecretRef | None
    metrics_token: SecretRef | None
    principal_tokens: tuple[PrincipalTokenSpec, ...]
    provider_auth: ProviderAuth
    stream_evidence_gate: StreamEvidenceGate
    max_queue: int
    queue_timeout_ms: int
    retry_before_first_byte: int
    eject_after_failures: int
    eject_base_s: float
    eject_max_s: float
    credential_plane_enabled: bool
    credential_plane: CredentialPlane | None  # None in legacy mode
    profiles: Mapping[str, RuntimeProfile] = field(hash=False)
    nodes: tuple[NodeSpec, ...]
    providers: Mapping[str, ProviderSpec] = field(hash=False)
    models: Mapping[str, ModelGroupSpec] = field(hash=False)
    _nodes_by_id: Mapping[str, NodeSpec] = field(repr=False, compare=False)
    _served_by_provider: Mapping[str, Mapping[str, str]] = field(repr=False, compare=False)
    principals: Mapping[str, PrincipalSpec] = field(hash=False)  # R-MGD-13, by id
    currency: str = DEFAULT_CURRENCY  # R-COST-1: metering.currency

    def price(self, group: str, provider_id: str | None) -> Price | None:
        """R-COST-1: the provider's price, else its model group's, else None (not priced)."""
        spec = self.providers.get(provider_id) if provider_id else None
        if spec is not None and spec.price is not None:
            return spec.price
        model = self.models.get(group)
        return model.price if model is not None else None

    @property
    def document(self) -> dict[str, Any]:
        """A fresh copy of the canonical document (defaults applied, legacy keys promoted)."""
        loaded: dict[str, Any] = json.loads(self.document_json)
        return loaded

    @property
    def digest(self) -> str:
        """sha256 of the canonical document with sorted keys: equal documents, equal digests."""
        canonical = json.dumps(self.document, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def node(self, node_id: str) -> NodeSpec | None:
        """The Node with this id, or None."""
        return self._nodes_by_id.get(node_id)

    def profile_family(self, profile: str) -> str | None:
        """The built-in a profile derives from: a credential slot serves one family (R-MGD-6)."""
        resolved = self.profiles.get(profile)
        for _ in range(len(self.profiles)):  # an overlay may sit on another overlay
            if resolved is None or resolved.base is None or resolved.base not in self.profiles:
                break
            resolved = self.profiles[resolved.base]
        if resolved is None:
            return None
        return resolved.base or resolved.name

    def served_models(self, provider_id: str) -> Mapping[str, str]:
        """Model group id -> served model name for every group that maps ``provider_id``."""
        return self._served_by_provider.get(provider_id, MappingProxyType({}))
