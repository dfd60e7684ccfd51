"""Resolve secrets named by reference ({env: NAME} | {file: PATH}) on the Node.

Errors name the reference, never the value (R-AUTH-6, R-REF-6).
"""

from __future__ import annotations

from nodes.wire import SecretRefPayload
from secretref import SecretReadError, read_secret


class SecretError(ValueError):
    """A secret reference that cannot be resolved; the message names only the reference."""


def resolve_secret(ref: SecretRefPayload, *, what: str = "secret") -> str:
    """Return the secret's value, stripped of surrounding whitespace (``secretref``)."""
    try:
        return read_secret(ref.env, ref.file)
    except SecretReadError as exc:
        raise SecretError(f"{what}: {exc}") from None


def redact(text: str, secrets: list[str] | tuple[str, ...]) -> str:
    """Replace every occurrence of a known secret in ``text`` (upstream messages may echo it)."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "<redacted>")
    return text
