"""Caller authentication and provider-credential rules (R-AUTH-1, R-AUTH-2, R-AUTH-3).

Built once per snapshot. A presented token is looked up by its SHA-256 hex: the lookup's
timing can only depend on the digest of the caller's own input, which reveals nothing about
a stored token (finding a token from digest prefixes means inverting SHA-256). No raw
token is kept.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from catalog.config import EdgeSnapshot, SecretRef
from pool.http.errors import HttpError
from pool.http.limits import DEFAULT_MAX_PENDING_BODIES, TokenLimits

log = logging.getLogger("iop.http")

Headers = dict[bytes, bytes]


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made the request (R-AUTH-1, R-CFG-12) and what its token may do (R-PRIN-1..3).

    ``models`` None = every model group; ``limits`` None = no per-token limit.
    """

    principal_ref: str | None
    token_ref: str | None
    models: frozenset[str] | None = None
    limits: TokenLimits | None = None
    max_queued: int | None = None
    max_pending_bodies: int = DEFAULT_MAX_PENDING_BODIES  # R-LIM-2

    def may_use(self, model: str) -> bool:
        """R-PRIN-1: whether the token's scope includes this model group."""
        return self.models is None or model in self.models


def _digest(token: bytes) -> str:
    return hashlib.sha256(token).hexdigest()


def presented_token(headers: Headers, x_api_key: bool) -> bytes | None:
    """``Authorization: Bearer <t>``; on the Anthropic shape also ``x-api-key: <t>``."""
    auth = headers.get(b"authorization")
    if auth is not None and auth[:7].lower() == b"bearer ":
        return auth[7:].strip()
    if x_api_key:
        return headers.get(b"x-api-key")
    return None


class AuthTable:
    """Configured caller tokens by sha256 hex: the legacy bearer token and principal tokens."""

    __slots__ = ("_by_digest",)

    def __init__(self, snapshot: EdgeSnapshot) -> None:
        by_digest: dict[str, Caller] = {}
        if snapshot.bearer_token is not None:
            digest = secret_digest(snapshot.bearer_token, "openai.bearer_token")
            if digest is not None:
                by_digest[digest] = Caller(None, None)
        for entry in snapshot.principal_tokens:  # a principal token's labels win over the bearer's
            limits = TokenLimits(entry.max_in_flight, entry.rpm, entry.tpm)
            by_digest[entry.token_hash_sha256.lower()] = Caller(
                entry.principal_ref,
                entry.token_ref,
                models=entry.models,
                limits=limits if limits.any else None,
                max_queued=entry.max_queued,
                max_pending_bodies=entry.max_pending_bodies or DEFAULT_MAX_PENDING_BODIES,
            )
        self._by_digest = by_digest

    def authenticate(self, headers: Headers, x_api_key: bool) -> Caller:
        """The caller of a valid token, else ``invalid_api_key`` (401)."""
        token = presented_token(headers, x_api_key)
        if token:
            caller = self._by_digest.get(_digest(token))
            if caller is not None:
                return caller
        raise HttpError("invalid_api_key")


def secret_digest(ref: SecretRef, path: str) -> str | None:
    """sha256 hex of a configured secret, or None (logged once per snapshot) if unreadable."""
    try:
        return _digest(ref.resolve().encode())
    except Exception as exc:  # the message names the reference, never a value
        log.warning("%s: %s; it authenticates nobody", path, exc)
        return None


class ProviderAuthRule:
    """What to do with a caller-supplied provider credential header (R-AUTH-2, R-AUTH-3)."""

    __slots__ = ("_header", "_managed", "enabled", "from_header", "required", "scheme", "target")

    def __init__(self, snapshot: EdgeSnapshot) -> None:
        config = snapshot.provider_auth
        self._managed = bool(snapshot.credential_plane_enabled)
        self.enabled = bool(config.enabled) and not self._managed
        self.from_header = config.from_header
        self._header = config.from_header.lower().encode("latin-1")
        self.target = config.target_header
        self.scheme = config.scheme
        self.required = bool(config.required)

    def forward_headers(self, headers: Headers) -> tuple[tuple[str, str], ...]:
        """Headers for the upstream of an OpenAI-compatible provider; () when none apply."""
        value = headers.get(self._header)
        if self._managed:
            if value is not None:  # R-AUTH-3: managed mode refuses them at request time
                raise HttpError("provider_credential_refused", param=self.from_header)
            return ()
        if not self.enabled:
            return ()  # legacy forwarding off: the header is never sent anywhere
        raw = value.decode("latin-1").strip() if value is not None else ""
        if self.scheme and raw[: len(self.scheme) + 1].lower() == self.scheme.lower() + " ":
            raw = raw[len(self.scheme) + 1 :].strip()  # accept "Bearer <t>" as well as "<t>"
        if not raw:
            if self.required:
                raise HttpError(
                    "invalid_api_key",
                    f"the {self.from_header} header is required",
                    param=self.from_header,
                )
            return ()
        return ((self.target, f"{self.scheme} {raw}" if self.scheme else raw),)
