"""Secrets by reference: ``{env: NAME}`` or ``{file: PATH}``, resolved where they are used."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


class SecretUnavailableError(RuntimeError):
    """A referenced secret could not be read; the message names the reference, never a value."""


@dataclass(frozen=True, slots=True)
class SecretRef:
    """A secret named by exactly one of an environment variable or a file path."""

    env: str | None = None
    file: str | None = None

    def __post_init__(self) -> None:
        if (self.env is None) == (self.file is None):
            raise ValueError("a secret reference needs exactly one of env or file")

    def __str__(self) -> str:
        return f"{{env: {self.env}}}" if self.env is not None else f"{{file: {self.file}}}"

    def resolve(self) -> str:
        """Read the secret now; surrounding whitespace (a file's trailing newline) is dropped."""
        if self.env is not None:
            value = os.environ.get(self.env)
            if value is None:
                raise SecretUnavailableError(f"secret {self}: environment variable is not set")
        else:
            try:
                value = Path(str(self.file)).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
                raise SecretUnavailableError(
                    f"secret {self}: cannot read file ({reason})"
                ) from None
        value = value.strip()
        if not value:
            raise SecretUnavailableError(f"secret {self}: value is empty")
        return value
