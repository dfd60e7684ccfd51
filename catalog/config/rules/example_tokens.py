"""Published example token hashes are refused at load (docs/configuration.md, "Token hashes").

The sha256 of a well-known word (the shipped example's ``test``, ``test2`` and ``foo``, the
test fixtures' ``node-token``, and a few words people try first) authenticates anyone who
guesses the word. Outside the project's own test suite such a hash is a load error that
names its path and says how to mint a token; the test suite opts in with
``IOP_ALLOW_EXAMPLE_TOKEN_HASHES=1``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

from catalog.config.errors import Issues
from catalog.config.rules.context import Context

ALLOW_ENV = "IOP_ALLOW_EXAMPLE_TOKEN_HASHES"
MANAGE = ".venv/bin/python manage.py"  # the project's venv (README)

_WORDS = (
    "",
    "test",
    "test2",
    "foo",
    "bar",
    "node-token",
    "token",
    "secret",
    "password",
    "changeme",
    "example",
    "admin",
)
WELL_KNOWN_HASHES = {hashlib.sha256(word.encode()).hexdigest(): word for word in _WORDS}


def example_hashes_allowed() -> bool:
    return os.environ.get(ALLOW_ENV) == "1"


def check_example_token_hashes(ctx: Context, issues: Issues) -> None:
    """Every ``token_hash_sha256`` (Nodes and principal tokens) must not be a published one."""
    if example_hashes_allowed():
        return
    for node in ctx.parsed.nodes:
        word = _well_known(node.item.raw.get("token_hash_sha256"))
        if word is not None:
            how = f"{MANAGE} iop_token --node {node.item.raw_id or 'NODE_ID'}"
            issues.add((*node.item.path, "token_hash_sha256"), _message(word, how))
    entries = ctx.parsed.raw_sections["openai"].get("principal_tokens")
    for index, entry in enumerate(entries if isinstance(entries, list) else []):
        if not isinstance(entry, Mapping):
            continue
        word = _well_known(entry.get("token_hash_sha256"))
        if word is not None:
            ref = entry.get("token_ref") if isinstance(entry.get("token_ref"), str) else "REF"
            how = f"{MANAGE} iop_token --principal {ref} --principal-ref PRINCIPAL"
            path = ("openai", "principal_tokens", index, "token_hash_sha256")
            issues.add(path, _message(word, how))


def _well_known(value: object) -> str | None:
    return WELL_KNOWN_HASHES.get(value) if isinstance(value, str) else None


def _message(word: str, how: str) -> str:
    return (
        f'is the sha256 of the published example token "{word}": anyone can present it. '
        f"Mint a token of your own (`{how}` stores its hash in the catalog; "
        "`python manage.py iop_token` prints a token and the sha256 to put here)"
    )
