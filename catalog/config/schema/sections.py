"""Root sections: edge, admin, provider_pool, credential_plane, and the TLS shapes."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from catalog.config.money import CURRENCY_PATTERN, DEFAULT_CURRENCY
from catalog.config.schema.base import (
    Doc,
    FileRef,
    Identifier,
    Listen,
    LoopbackListen,
    NonEmpty,
    Secret,
    matching,
)


class ServerTLSDoc(Doc):
    """A listener's certificate and key files (and an optional client CA for mutual TLS)."""

    cert_file: FileRef
    key_file: FileRef
    client_ca_file: FileRef | None = None


class EdgeDoc(Doc):
    """``edge``: identity and the Node websocket listener."""

    id: Identifier = "edge-local"
    listen: Listen = "127.0.0.1:7700"
    bootstrap_dir: NonEmpty = "var/bootstrap"
    tls: ServerTLSDoc | None = None


class AdminDoc(Doc):
    """``admin``: the operator-local refresh listener (loopback only, R-REF-1)."""

    listen: LoopbackListen = "127.0.0.1:7701"
    # Optional bearer token every request must present (docs/configuration.md, "admin").
    token: Secret | None = None


class ProviderPoolDoc(Doc):
    """``provider_pool``: the one root queue policy (R-CFG-7); None means omitted."""

    max_queue: Annotated[int, Field(ge=0)] | None = None
    queue_timeout_ms: Annotated[int, Field(ge=0)] | None = None
    # Provider health (R-HEALTH-1, R-HEALTH-2); defaults in catalog.config.rules.context.
    retry_before_first_byte: Annotated[int, Field(ge=0, le=3)] | None = None
    eject_after_failures: Annotated[int, Field(ge=0, le=1000)] | None = None
    eject_base_s: Annotated[float, Field(gt=0, le=3600)] | None = None
    eject_max_s: Annotated[float, Field(gt=0, le=86400)] | None = None


class MeteringDoc(Doc):
    """``metering`` (R-COST-1): the one currency of every price and budget amount."""

    currency: Annotated[
        str, matching(CURRENCY_PATTERN, "must be three uppercase letters (ISO 4217, e.g. USD)")
    ] = DEFAULT_CURRENCY


class ClientTLSDoc(Doc):
    """TLS settings of an outbound connector; every value is a file reference."""

    ca_file: FileRef | None = None
    cert_file: FileRef | None = None
    key_file: FileRef | None = None


class IssuerDoc(Doc):
    """``credential_plane.issuer``: the Edge's Ed25519 signing key for lease envelopes (R-MGD-4)."""

    key_id: Identifier
    private_key_file: FileRef


class CredentialPlaneDoc(Doc):
    """``credential_plane``: managed credential mode (R-AUTH-3..6, R-MGD-1..6)."""

    enabled: bool = False
    issuer: IssuerDoc | None = None
    keyring_file: FileRef | None = None
    envelope_ttl_s: Annotated[int, Field(ge=5, le=3600)] = 60
    # R-MGD-1: an external connector is not supported; the key is read only to refuse it.
    control_plane: Any = None
