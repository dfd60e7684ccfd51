"""Per-run lease envelopes, the Edge's half: seal a slot secret to one Node for one run (R-MGD-4).

The secret is encrypted to the Node's recipient X25519 key (an ephemeral X25519 exchange,
HKDF-SHA256, ChaCha20-Poly1305) with the binding as associated data, and the whole
envelope is signed with the issuer's Ed25519 key. The binding names the run, Node,
provider, slot, credential revision, route revision, connection generation and an expiry.
The format is shared with the Node's half (``nodes.agent.envelope``); nothing here imports
Django. See docs/credentials.md.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from secretref.keyfiles import PrivateFileError, check_private

VERSION = 1
HKDF_INFO = b"iop-edge lease envelope v1"
NONCE_BYTES = 12
DEFAULT_TTL_S = 60
MAX_KEY_FILE_BYTES = 16 * 1024


class KeyFileError(ValueError):
    """A managed-mode key file cannot be used; the message names the file, never a key."""


class KeyFileExposed(KeyFileError):
    """A private key file its group or others can read (R-TLS-5): the process does not
    start; the message names the file and the fix."""


def load_key(path: str, what: str, kind: type, label: str, *, private: bool) -> Any:
    """The PEM key in ``path`` (the config key ``what`` names it), which must be a ``label``
    (Ed25519, X25519) private or public key. Used by the Edge and the Node alike."""
    side = "private" if private else "public"
    try:
        data = Path(path).expanduser().read_bytes()[: MAX_KEY_FILE_BYTES + 1]
    except OSError as exc:
        raise KeyFileError(f"{what}: cannot read {path} ({exc.strerror})") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"{what}: {path} is larger than {MAX_KEY_FILE_BYTES} bytes")
    try:
        if private:
            key: object = serialization.load_pem_private_key(data, password=None)
        else:
            key = serialization.load_pem_public_key(data)
    except ValueError:
        raise KeyFileError(f"{what}: {path} is not a PEM {side} key") from None
    if not isinstance(key, kind):
        raise KeyFileError(f"{what}: {path} is not an {label} {side} key")
    if private:
        try:
            check_private(Path(path).expanduser(), what)
        except PrivateFileError as exc:
            raise KeyFileExposed(str(exc)) from None
    return key


def key_id(public: X25519PublicKey) -> str:
    """A recipient key's id derived from the key itself (``iop-node keygen``, R-TLS-5)."""
    return "x25519-" + hashlib.sha256(raw_public(public)).hexdigest()[:16]


class SealRefused(Exception):
    """An Edge cannot issue the envelope of a run routed to it; ``str`` is safe to show."""


@dataclass(frozen=True, slots=True)
class SlotGrant:
    """What the Edge holding a run's Node needs to issue its envelope (R-SCALE-7): the slot as
    stored (sealed under the keyring, the slot id bound; never the secret) and the revisions
    the requesting Edge resolved, so both Edges bind exactly the same credential."""

    slot_id: str
    credential_revision: int
    route_revision: int
    sealed: str


@dataclass(frozen=True, slots=True)
class Binding:
    """What one envelope is good for: exactly one run of one provider on one Node."""

    run_id: str
    node_id: str
    provider_id: str
    slot_id: str
    credential_revision: int
    route_revision: int
    generation: int


BINDING_FIELDS = Binding.__slots__


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode()


def unb64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise ValueError("not a base64 string")
    return base64.urlsafe_b64decode(text.encode())


def canonical(fields: dict[str, Any]) -> bytes:
    """The bytes both sides sign and bind: sorted keys, no spaces."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def derive_key(shared: bytes, ephemeral: bytes, recipient: bytes) -> bytes:
    return HKDF(
        algorithm=hashes.SHA256(), length=32, salt=ephemeral + recipient, info=HKDF_INFO
    ).derive(shared)


def raw_public(key: X25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class SharedKey:
    """An ephemeral X25519 key agreed with one recipient: its public half (``epk``) and the
    AEAD under the derived key. Reused for a bounded number of envelopes and time
    (``EphemeralKeys``): the two X25519 operations and HKDF were most of an envelope's cost,
    and the Node derives the key from ``epk`` either way (docs/credentials.md, "Choices")."""

    __slots__ = ("aead", "epk", "expires", "uses_left")

    def __init__(self, recipient: X25519PublicKey, *, expires: float, uses: int) -> None:
        ephemeral = X25519PrivateKey.generate()
        self.epk = raw_public(ephemeral.public_key())
        key = derive_key(ephemeral.exchange(recipient), self.epk, raw_public(recipient))
        self.aead = ChaCha20Poly1305(key)
        self.expires = expires
        self.uses_left = uses


class EphemeralKeys:
    """One ``SharedKey`` per recipient key id, replaced after ``max_uses`` envelopes or
    ``max_age_s`` seconds, whichever comes first. Random 96-bit nonces stay far from a
    collision at these counts."""

    def __init__(self, *, max_uses: int = 65536, max_age_s: float = 60.0) -> None:
        self.max_uses = max_uses
        self.max_age_s = max_age_s
        self._keys: dict[str, SharedKey] = {}

    def for_recipient(self, key_id: str, recipient: X25519PublicKey, now: float) -> SharedKey:
        shared = self._keys.get(key_id)
        if shared is None or shared.uses_left <= 0 or now >= shared.expires:
            shared = SharedKey(recipient, expires=now + self.max_age_s, uses=self.max_uses)
            self._keys[key_id] = shared
        shared.uses_left -= 1
        return shared


def issue(
    secret: bytes,
    binding: Binding,
    *,
    recipient_key_id: str,
    recipient: X25519PublicKey,
    issuer_key_id: str,
    issuer: Ed25519PrivateKey,
    now: float,
    ttl_s: float = DEFAULT_TTL_S,
    shared: SharedKey | None = None,
) -> dict[str, Any]:
    """A sealed, signed envelope (JSON-able) carrying ``secret`` for ``binding`` only;
    ``shared``: a key agreed with this recipient already (else a fresh one)."""
    if shared is None:
        shared = SharedKey(recipient, expires=now, uses=1)
    header: dict[str, Any] = {
        "v": VERSION,
        "id": b64(os.urandom(16)),
        "issuer": issuer_key_id,
        "recipient": recipient_key_id,
        "expires_at": int(now + ttl_s),
        "epk": b64(shared.epk),
        **{name: getattr(binding, name) for name in BINDING_FIELDS},  # asdict deep-copies
    }
    nonce = os.urandom(NONCE_BYTES)
    body = {**header, "nonce": b64(nonce)}
    body["ct"] = b64(shared.aead.encrypt(nonce, secret, canonical(header)))
    body["sig"] = b64(issuer.sign(canonical(body)))
    return body
