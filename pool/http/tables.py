"""Everything a request looks up, precomputed once per snapshot (rebuilt when it changes)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from catalog.config import EdgeSnapshot
from pool.http.auth import AuthTable, ProviderAuthRule
from pool.http.operations import Target, build_targets


def _model_entry(model_id: str, created: int, created_at: str) -> dict[str, Any]:
    # One object that reads as an OpenAI model and as an Anthropic model info: both SDKs
    # list models from GET /v1/models and ignore the other's fields.
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "iop-edge",
        "type": "model",
        "display_name": model_id,
        "created_at": created_at,
    }


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=True, separators=(",", ":")).encode()


class Tables:
    """Auth by digest, provider-credential rule, (group, provider) targets, the model list."""

    __slots__ = (
        "_scoped",
        "auth",
        "long_threshold",
        "max_request_bytes",
        "model_bodies",
        "models_body",
        "provider_auth",
        "snapshot",
        "targets",
        "translating",
    )

    def __init__(self, snapshot: EdgeSnapshot, started_at: float) -> None:
        self.snapshot = snapshot
        self.auth = AuthTable(snapshot)
        self.provider_auth = ProviderAuthRule(snapshot)
        self.targets: dict[tuple[str, str], Target] = build_targets(snapshot)
        self.long_threshold: int = snapshot.long_context_threshold_tokens
        self.max_request_bytes: int = snapshot.max_request_bytes
        self.translating = frozenset(m.id for m in snapshot.models.values() if m.translate)
        # R-CFG-11: the catalog's model groups, never a provider's own /models answer.
        created = int(started_at)
        created_at = datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        entries = [_model_entry(mid, created, created_at) for mid in sorted(snapshot.models)]
        self.model_bodies = {entry["id"]: _dumps(entry) for entry in entries}
        self.models_body = _list_body(entries)
        # R-PRIN-1: one list per distinct token scope, built once per snapshot.
        self._scoped: dict[frozenset[str], bytes] = {}
        for token in snapshot.principal_tokens:
            if token.models is not None and token.models not in self._scoped:
                scoped = [e for e in entries if e["id"] in token.models]
                self._scoped[token.models] = _list_body(scoped)

    def target(self, model: str, provider_id: str) -> Target | None:
        return self.targets.get((model, provider_id))

    def models_list(self, scope: frozenset[str] | None) -> bytes:
        """The ``/v1/models`` body for a token scope (None = every group)."""
        return self.models_body if scope is None else self._scoped[scope]


def _list_body(entries: list[dict[str, Any]]) -> bytes:
    return _dumps(
        {
            "object": "list",
            "data": entries,
            "has_more": False,
            "first_id": entries[0]["id"] if entries else None,
            "last_id": entries[-1]["id"] if entries else None,
        }
    )
