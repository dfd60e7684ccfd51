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
from dataclasses import asdict, dataclass
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
) -> dict[str, Any]:
    """A sealed, signed envelope (JSON-able) carrying ``secret`` for ``binding`` only."""
    ephemeral = X25519PrivateKey.generate()
    epk = raw_public(ephemeral.public_key())
    key = derive_key(ephemeral.exchange(recipient), epk, raw_public(recipient))
    header: dict[str, Any] = {
        "v": VERSION,
        "id": b64(os.urandom(16)),
        "issuer": issuer_key_id,
        "recipient": recipient_key_id,
        "expires_at": int(now + ttl_s),
        "epk": b64(epk),
        **asdict(binding),
    }
    nonce = os.urandom(NONCE_BYTES)
    body = {**header, "nonce": b64(nonce)}
    body["ct"] = b64(ChaCha20Poly1305(key).encrypt(nonce, secret, canonical(header)))
    body["sig"] = b64(issuer.sign(canonical(body)))
    return body
