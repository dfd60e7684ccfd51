"""The refresh report: stable, sorted, never-null lists of what a candidate changes (R-REF-4).

Each changed path carries its old and new value so an operator sees what an apply does
(``capacity`` 2 -> 5), except where the path is secret: credentials, secret references, header
and environment maps, token hashes and program argv are marked ``secret`` and carry no value,
and inside a shown value (an added entry) those fields read ``[redacted]`` (R-REF-6). Loader
messages are scrubbed of any literal secret written in the candidate as a second line of
defence. docs/refresh.md, "The report".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from refresh.classify import LIVE, classify
from refresh.diff import ABSENT, Change, Key, Path, diff_documents

REDACTED = "[redacted]"
# Document keys whose literal string values (and, for maps, entry values) are secret material.
_SECRET_KEYS = frozenset(
    {"bearer_token", "metrics_token", "token", "credential", "token_hash_sha256"}
)
_SECRET_MAPS = frozenset({"headers", "env"})
# Fields whose value is never shown in a report, even as a reference (an env name or a file
# path says where a secret lives); argv may carry a key on the command line of a legacy CLI.
_HIDDEN_FIELDS = _SECRET_KEYS | _SECRET_MAPS | {"command", "probe_command"}
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@?#]*@")


@dataclass(frozen=True, slots=True)
class Report:
    """The outcome of a diff, dry-run or apply; ``as_dict`` is the wire and storage form."""

    mode: str
    outcome: str
    valid: bool = True
    changes: tuple[dict[str, str], ...] = ()
    changed_nodes: tuple[str, ...] = ()
    changed_providers: tuple[str, ...] = ()
    changed_models: tuple[str, ...] = ()
    applied: bool = False
    pushed_nodes: tuple[str, ...] = ()
    errors: tuple[dict[str, str], ...] = ()
    revision: int | None = None
    parent: int | None = None
    active: int | None = None

    @property
    def live_paths(self) -> list[str]:
        return [c["path"] for c in self.changes if c["class"] == LIVE]

    @property
    def restart_required_paths(self) -> list[str]:
        return [c["path"] for c in self.changes if c["class"] != LIVE]

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    def but(self, **fields: Any) -> Report:
        """A copy with some fields replaced."""
        return replace(self, **fields)

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "outcome": self.outcome,
            "valid": self.valid,
            "changed": self.changed,
            "changed_nodes": sorted(self.changed_nodes),
            "changed_providers": sorted(self.changed_providers),
            "changed_models": sorted(self.changed_models),
            "live_paths": sorted(self.live_paths),
            "restart_required_paths": sorted(self.restart_required_paths),
            "changes": sorted(self.changes, key=lambda c: c["path"]),
            "applied": self.applied,
            "pushed_nodes": sorted(self.pushed_nodes),
            "errors": sorted(self.errors, key=lambda e: (e["path"], e["message"])),
            "revision": self.revision,
            "parent": self.parent,
            "active": self.active,
        }


def diff_report(
    old: Mapping[str, Any] | None, new: Mapping[str, Any], *, mode: str, outcome: str
) -> Report:
    """Diff two canonical documents and classify every path; ``old=None`` means nothing active."""
    before = old if old is not None else {}
    classified = classify(diff_documents(before, new))
    nodes, providers, models = _affected([c.change.path for c in classified], before, new)
    changes = tuple(
        {
            "path": c.change.text,
            "kind": c.change.kind,
            "class": c.klass,
            "reason": c.reason,
            **shown_values(c.change),
        }
        for c in classified
    )
    return Report(
        mode=mode,
        outcome=outcome,
        changes=changes,
        changed_nodes=tuple(sorted(nodes)),
        changed_providers=tuple(sorted(providers)),
        changed_models=tuple(sorted(models)),
    )


def shown_values(change: Change) -> dict[str, Any]:
    """``{"secret": False, "old": ..., "new": ...}`` (a side absent where the path does not
    exist), or ``{"secret": True}`` for a path whose value is never shown (R-REF-6)."""
    hidden = any(isinstance(s, str) and s in _HIDDEN_FIELDS for s in change.path)
    if hidden or _is_reference(change.old) or _is_reference(change.new):
        return {"secret": True}
    out: dict[str, Any] = {"secret": False}
    if change.old is not ABSENT:
        out["old"] = redacted(change.old)
    if change.new is not ABSENT:
        out["new"] = redacted(change.new)
    return out


def values_text(change: Mapping[str, Any], limit: int = 300) -> str:
    """One line for a person: ``2 → 5``, ``(none) → {...}``, or ``changed`` for a secret path;
    a side longer than ``limit`` characters is cut with an ellipsis."""
    if change.get("secret", True):
        return "changed"

    def side(name: str) -> str:
        if name not in change:
            return "(none)"
        text = json.dumps(change[name], ensure_ascii=False, sort_keys=True)
        return text if len(text) <= limit else text[: limit - 1] + "…"

    return f"{side('old')} → {side('new')}"


def redacted(value: Any) -> Any:
    """A copy of a config value with every secret field, secret reference, header or
    environment value and URL user-info replaced by ``[redacted]``."""
    if isinstance(value, Mapping):
        if _is_reference(value):
            return REDACTED
        return {
            name: REDACTED if name in _HIDDEN_FIELDS else redacted(child)
            for name, child in value.items()
        }
    if isinstance(value, list):
        return [redacted(child) for child in value]
    if isinstance(value, str):
        return _USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", value)
    return value


def _is_reference(value: Any) -> bool:
    return isinstance(value, Mapping) and len(value) == 1 and ("env" in value or "file" in value)


def error_report(
    mode: str, outcome: str, issues: Iterable[tuple[str, str]], document: Any = None
) -> Report:
    """A refused candidate: every (path, message), scrubbed of secrets written in ``document``."""
    secrets = sorted(secret_literals(document), key=len, reverse=True)
    errors = tuple({"path": path, "message": scrub(message, secrets)} for path, message in issues)
    return Report(mode=mode, outcome=outcome, valid=False, errors=errors)


def scrub(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def secret_literals(value: Any, key: str = "") -> set[str]:
    """Literal strings written where a secret or a hash belongs (they must never be echoed)."""
    found: set[str] = set()
    if isinstance(value, Mapping):
        for name, child in value.items():
            if name in _SECRET_MAPS and isinstance(child, Mapping):
                found |= {v for v in child.values() if isinstance(v, str) and v}
            found |= secret_literals(child, str(name))
    elif isinstance(value, list):
        for child in value:
            found |= secret_literals(child, key)
    elif isinstance(value, str) and key in _SECRET_KEYS and value:
        found.add(value)
    return found


def _ids(items: Any, field: str = "id") -> set[str]:
    if not isinstance(items, list):
        return set()
    return {item[field] for item in items if isinstance(item, Mapping) and field in item}


def _node_providers(doc: Mapping[str, Any], node_id: str | None = None) -> set[str]:
    out: set[str] = set()
    for node in doc.get("nodes") or ():
        if isinstance(node, Mapping) and node_id in (None, node.get("id")):
            out |= _ids(node.get("providers"))
    return out


def _mapped(doc: Mapping[str, Any], model_id: str | None = None) -> set[str]:
    out: set[str] = set()
    for model in doc.get("models") or ():
        if isinstance(model, Mapping) and model_id in (None, model.get("id")):
            providers = model.get("providers")
            out |= set(providers) if isinstance(providers, Mapping) else set()
    return out


def _profile_users(doc: Mapping[str, Any], names: set[str] | None) -> set[str]:
    """Providers whose profile is one of ``names`` (all custom profiles when None), directly
    or through a custom profile's ``base`` chain."""
    profiles = doc.get("protocol_profiles")
    profiles = profiles if isinstance(profiles, Mapping) else {}
    wanted = set(profiles) if names is None else set(names)

    def uses(name: Any, seen: frozenset[str] = frozenset()) -> bool:
        if not isinstance(name, str) or name in seen:
            return False
        if name in wanted:
            return True
        overlay = profiles.get(name)
        return isinstance(overlay, Mapping) and uses(overlay.get("base"), seen | {name})

    return {
        provider["id"]
        for node in doc.get("nodes") or ()
        if isinstance(node, Mapping)
        for provider in node.get("providers") or ()
        if isinstance(provider, Mapping) and "id" in provider and uses(provider.get("profile"))
    }


def _hosts(doc: Mapping[str, Any]) -> dict[str, str]:
    return {
        provider: node["id"]
        for node in doc.get("nodes") or ()
        if isinstance(node, Mapping) and "id" in node
        for provider in _ids(node.get("providers"))
    }


def _affected(
    paths: list[Path], old: Mapping[str, Any], new: Mapping[str, Any]
) -> tuple[set[str], set[str], set[str]]:
    """Nodes, providers and models touched by the changed paths.

    A provider whose served models change (a model mapping edit) is changed too, and so is
    the Node that hosts it: that Node's payload changes and it gets a refresh push (R-NODE-4).
    """
    nodes: set[str] = set()
    providers: set[str] = set()
    models: set[str] = set()
    docs = (old, new)
    for path in paths:
        head = path[0] if path else None
        entry = path[1].name if len(path) > 1 and isinstance(path[1], Key) else None
        whole = len(path) == 2 or (len(path) == 3 and path[2] == "providers")
        child = path[3].name if len(path) > 3 and isinstance(path[3], Key) else None
        if head == "models":
            if entry is None:
                models |= {m for d in docs for m in _ids(d.get("models"))}
                providers |= {p for d in docs for p in _mapped(d)}
                continue
            models.add(entry)
            if whole:
                providers |= {p for d in docs for p in _mapped(d, entry)}
            elif child is not None and path[2] == "providers":
                providers.add(child)
        elif head == "nodes":
            if entry is None:
                nodes |= {n for d in docs for n in _ids(d.get("nodes"))}
                providers |= {p for d in docs for p in _node_providers(d)}
                continue
            nodes.add(entry)
            if whole:
                providers |= {p for d in docs for p in _node_providers(d, entry)}
            elif child is not None and path[2] == "providers":
                providers.add(child)
        elif head == "protocol_profiles":  # a profile edit changes every provider using it
            names = {entry} if entry is not None else None
            providers |= {p for d in docs for p in _profile_users(d, names)}
    for doc in docs:
        hosts = _hosts(doc)
        nodes |= {hosts[p] for p in providers if p in hosts}
    return nodes, providers, models
