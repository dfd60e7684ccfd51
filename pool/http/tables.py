"""Everything a request looks up, precomputed once per snapshot (rebuilt when it changes)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from catalog.config import EdgeSnapshot
from pool.http.auth import AuthTable, ProviderAuthRule
from pool.http.errors import HttpError
from pool.http.managed import ManagedKeys, ManagedPlane
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
        "_entries",
        "_scoped",
        "auth",
        "fits",
        "long_threshold",
        "managed",
        "max_request_bytes",
        "model_bodies",
        "models_body",
        "provider_auth",
        "snapshot",
        "stream_buffer_bytes",
        "targets",
        "translating",
    )

    def __init__(
        self, snapshot: EdgeSnapshot, started_at: float, managed_keys: ManagedKeys | None = None
    ) -> None:
        self.snapshot = snapshot
        self.auth = AuthTable(snapshot)
        self.provider_auth = ProviderAuthRule(snapshot)
        # Managed mode (R-MGD): over the keys read once at start (R-MGD-7), never re-read here.
        self.managed = None
        if snapshot.credential_plane is not None:
            assert managed_keys is not None, "managed mode needs the keys read at start"
            self.managed = ManagedPlane(snapshot, managed_keys)
        self.targets: dict[tuple[str, str], Target] = build_targets(snapshot)
        self.long_threshold: int = snapshot.long_context_threshold_tokens
        self.max_request_bytes: int = snapshot.max_request_bytes
        self.translating = frozenset(m.id for m in snapshot.models.values() if m.translate)
        self.stream_buffer_bytes: int = snapshot.stream_buffer_bytes
        self.fits = {group.id: Fit.of(group, snapshot) for group in snapshot.models.values()}
        # R-CFG-11: the catalog's model groups, never a provider's own /models answer.
        created = int(started_at)
        created_at = datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        entries = [_model_entry(mid, created, created_at) for mid in sorted(snapshot.models)]
        self.model_bodies = {entry["id"]: _dumps(entry) for entry in entries}
        self.models_body = _list_body(entries)
        # R-PRIN-1: one list per distinct token scope, built once per snapshot; a route key's
        # scope (its one group, R-MGD-9) is added the first time it lists models.
        self._entries = entries
        self._scoped: dict[frozenset[str], bytes] = {}
        for token in snapshot.principal_tokens:
            if token.models is not None:
                self.models_list(token.models)

    def target(self, model: str, provider_id: str) -> Target | None:
        return self.targets.get((model, provider_id))

    def models_list(self, scope: frozenset[str] | None) -> bytes:
        """The ``/v1/models`` body for a token scope (None = every group)."""
        if scope is None:
            return self.models_body
        body = self._scoped.get(scope)
        if body is None:  # bounded: a scope is a set of the snapshot's groups
            body = _list_body([e for e in self._entries if e["id"] in scope])
            self._scoped[scope] = body
        return body

    def check_fits(self, model: str, estimate: int, long: bool) -> None:
        """R-IN-4: 400 ``context_length_exceeded`` for a request no provider could ever hold."""
        fit = self.fits.get(model)
        if fit is None:
            return  # an unknown model is the pool's answer (model_not_found)
        if fit.window is not None and estimate > fit.window:
            raise HttpError(
                "context_length_exceeded",
                f"about {estimate} input tokens; the largest context window of "
                f"'{model}' is {fit.window}",
                "messages",
            )
        if long and not fit.long_slots:
            raise HttpError(
                "context_length_exceeded",
                f"about {estimate} input tokens is a long-context request and no provider of "
                f"'{model}' has long-context slots",
                "messages",
            )


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


@dataclass(frozen=True, slots=True)
class Fit:
    """What the largest provider of a model group can hold, online or not (R-IN-4)."""

    window: int | None  # the largest context window; None when a provider declares none
    long_slots: bool  # some provider has long-context slots (enabled or not)

    @classmethod
    def of(cls, group: Any, snapshot: Any) -> Fit:
        specs = [snapshot.providers[p] for p in group.providers if p in snapshot.providers]
        windows = [spec.context_window_tokens for spec in specs]
        window = None if not windows or None in windows else max(windows)
        return cls(window, any(spec.long_context_capacity > 0 for spec in specs))
