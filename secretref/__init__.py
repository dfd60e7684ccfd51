"""Read a secret named by reference, ``{env: NAME}`` or ``{file: PATH}``: one behaviour for
the Edge (``catalog.config.secrets``) and the Node (``nodes.agent.secrets``).

A leaf package: it imports nothing of the project and no Django, so the Node agent can use
it (docs/architecture.md, "Packages and allowed imports"). A failure says why in words that
name the reference, never a value (R-AUTH-6, R-REF-6).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["SecretReadError", "read_secret"]


class SecretReadError(ValueError):
    """The reference cannot be read; the message names it, never a value."""


def read_secret(env: str | None = None, file: str | None = None) -> str:
    """The secret's value with surrounding whitespace dropped (a key file's trailing newline
    is never part of the key). ``file`` may start with ``~``; it must be UTF-8 text."""
    if (env is None) == (file is None):
        raise SecretReadError("exactly one of env or file must be set")
    if env is not None:
        raw = os.environ.get(env)
        if raw is None:
            raise SecretReadError(f"environment variable {env} is not set")
        where = f"environment variable {env}"
    else:
        assert file is not None
        try:
            raw = Path(file).expanduser().read_text(encoding="utf-8")
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise SecretReadError(f"cannot read file {file} ({reason})") from None
        except UnicodeDecodeError:
            raise SecretReadError(f"file {file} is not UTF-8 text") from None
        where = f"file {file}"
    value = raw.strip()
    if not value:
        raise SecretReadError(f"{where} is empty")
    return value
