"""Secrets by reference: ``{env: NAME}`` or ``{file: PATH}``, resolved where they are used."""

from __future__ import annotations

from dataclasses import dataclass

from secretref import SecretReadError, read_secret


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
        """Read the secret now (``secretref``: surrounding whitespace dropped, ``~`` expanded)."""
        try:
            return read_secret(self.env, self.file)
        except SecretReadError as exc:
            raise SecretUnavailableError(f"secret {self}: {exc}") from None
