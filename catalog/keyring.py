"""Slot secrets sealed at rest: AES-256-GCM under a keyring file (R-MGD-2).

The keyring is a JSON object of key id -> base64 of a 32-byte key. The last entry is the
newest: it seals; every entry opens. A sealed value names the key that sealed it and is
bound to the slot it belongs to (the slot id is the associated data), so a ciphertext
copied to another slot's row does not open. Pure: no Django, no I/O beyond the file.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

FORMAT = "v1"
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
MAX_KEYRING_BYTES = 64 * 1024


class KeyringError(Exception):
    """The keyring file or a sealed value cannot be used; the message names what, never a key."""


class Keyring:
    """Key id -> AES-256-GCM key; the last one seals."""

    __slots__ = ("_aead", "_keys", "newest")

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        if not keys:
            raise KeyringError("the keyring holds no key")
        for key_id, key in keys.items():
            if not key_id or ":" in key_id or len(key) != KEY_BYTES:
                raise KeyringError(
                    f"keyring key {key_id!r} must be a 32-byte key under an id without ':'"
                )
        self._keys = dict(keys)
        self._aead = {key_id: AESGCM(key) for key_id, key in self._keys.items()}  # built once
        self.newest = next(reversed(self._keys))

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    @classmethod
    def load(cls, path: str | Path) -> Keyring:
        path = Path(path).expanduser()
        try:
            raw = path.read_bytes()[: MAX_KEYRING_BYTES + 1]
        except OSError as exc:
            raise KeyringError(f"cannot read the keyring file {path}: {exc.strerror}") from None
        if len(raw) > MAX_KEYRING_BYTES:
            raise KeyringError(f"the keyring file {path} is larger than {MAX_KEYRING_BYTES} bytes")
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise ValueError
            keys = {str(k): base64.b64decode(v, validate=True) for k, v in doc.items()}
        except (ValueError, TypeError, binascii.Error):
            raise KeyringError(
                f"the keyring file {path} is not a JSON object of key id -> base64 key"
            ) from None
        return cls(keys)

    def dump(self) -> str:
        return json.dumps(
            {k: base64.b64encode(v).decode() for k, v in self._keys.items()}, indent=2
        )

    def with_new_key(self, key_id: str) -> Keyring:
        """A keyring with one more key, which becomes the newest (rotation)."""
        if key_id in self._keys:
            raise KeyringError(f"the keyring already holds key {key_id!r}")
        return Keyring({**self._keys, key_id: secrets.token_bytes(KEY_BYTES)})

    def seal(self, plaintext: bytes, slot_id: str) -> str:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._aead[self.newest].encrypt(nonce, plaintext, slot_id.encode())
        return f"{FORMAT}:{self.newest}:{base64.b64encode(nonce + sealed).decode()}"

    def open(self, token: str, slot_id: str) -> bytes:
        try:
            version, key_id, body = token.split(":", 2)
            blob = base64.b64decode(body, validate=True)
        except (ValueError, binascii.Error):
            raise KeyringError(f"slot {slot_id!r}: the sealed value is malformed") from None
        if len(blob) <= NONCE_BYTES:  # a corrupted row: no room for a nonce and a tag
            raise KeyringError(f"slot {slot_id!r}: the sealed value is malformed")
        if version != FORMAT:
            raise KeyringError(f"slot {slot_id!r}: unknown sealed format {version!r}")
        if len(blob) < NONCE_BYTES + TAG_BYTES:  # a corrupted row: not even a nonce and a tag
            raise KeyringError(f"slot {slot_id!r}: the sealed value is malformed")
        aead = self._aead.get(key_id)
        if aead is None:
            raise KeyringError(
                f"slot {slot_id!r} is sealed under key {key_id!r}, not in the keyring"
            )
        try:
            return aead.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], slot_id.encode())
        except InvalidTag:
            raise KeyringError(
                f"slot {slot_id!r}: the sealed value does not open (tampered or moved)"
            ) from None

    def sealed_with_newest(self, token: str) -> bool:
        return token.split(":", 2)[1:2] == [self.newest]

    def missing_key(self, token: str) -> bool:
        """True when ``token`` names a key this keyring does not hold."""
        parts = token.split(":", 2)
        return len(parts) == 3 and parts[1] not in self._keys


def new_keyring(key_id: str) -> Keyring:
    return Keyring({key_id: secrets.token_bytes(KEY_BYTES)})
