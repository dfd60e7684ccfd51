"""Minting a caller or Node token (R-CFG-12): only its sha256 is ever stored. No Django here:
`make run`'s first setup (scripts/run_local.py) mints in its own process."""

from __future__ import annotations

import hashlib
import secrets

TOKEN_PREFIX = "iop_"


def mint_token() -> tuple[str, str]:
    """A new random token and the sha256 hex of its exact text (what callers present)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return token, hashlib.sha256(token.encode("ascii")).hexdigest()
