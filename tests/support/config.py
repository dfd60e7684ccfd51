"""Config documents in tests: the issues a document is refused with, a provider by id."""

from __future__ import annotations

from typing import Any

import pytest

from catalog.config import ConfigError, load_snapshot

Doc = dict[str, Any]


def load_issues(document: Any) -> list[str]:
    """The issues (``path: message``) the loader refuses ``document`` with; fails if it loads."""
    with pytest.raises(ConfigError) as caught:
        load_snapshot(document)
    return [str(issue) for issue in caught.value.issues]


def provider(document: Doc, provider_id: str) -> Doc:
    """The provider entry ``provider_id`` of any node of ``document`` (to edit in place)."""
    return next(p for n in document["nodes"] for p in n["providers"] if p["id"] == provider_id)
