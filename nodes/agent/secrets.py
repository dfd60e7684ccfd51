"""Resolve secrets named by reference ({env: NAME} | {file: PATH}) on the Node.

Errors name the reference, never the value (R-AUTH-6, R-REF-6).
"""

from __future__ import annotations

import os
from pathlib import Path

from nodes.wire import SecretRefPayload


class SecretError(ValueError):
    """A secret reference that cannot be resolved; the message names only the reference."""


def resolve_secret(ref: SecretRefPayload, *, what: str = "secret") -> str:
    """Return the secret's value, stripped of surrounding whitespace (a trailing newline
    in a key file is never part of the key)."""
    if (ref.env is None) == (ref.file is None):
        raise SecretError(f"{what}: exactly one of env or file must be set")
    if ref.env is not None:
        value = os.environ.get(ref.env)
        if value is None or not value.strip():
            raise SecretError(f"{what}: environment variable {ref.env} is not set")
        return value.strip()
    assert ref.file is not None
    try:
        value = Path(ref.file).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise SecretError(f"{what}: cannot read file {ref.file} ({exc.strerror})") from None
    if not value.strip():
        raise SecretError(f"{what}: file {ref.file} is empty")
    return value.strip()


def redact(text: str, secrets: list[str] | tuple[str, ...]) -> str:
    """Replace every occurrence of a known secret in ``text`` (upstream messages may echo it)."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "<redacted>")
    return text
