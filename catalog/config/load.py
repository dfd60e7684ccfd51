"""Loading: document -> parse -> rules -> snapshot, all or nothing (R-CFG-5)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from catalog.config.build import build_snapshot
from catalog.config.errors import ROOT, ConfigError, ConfigIssue, Issues
from catalog.config.parsed import parse_document
from catalog.config.profiles.overlay import resolve_profiles
from catalog.config.rules import RULES, Context
from catalog.config.snapshot import EdgeSnapshot
from catalog.config.text import parse_text


def load_snapshot(document: Mapping[str, Any]) -> EdgeSnapshot:
    """Validate every rule over ``document``; raise ConfigError with every issue, sorted."""
    if not isinstance(document, Mapping):
        raise ConfigError([ConfigIssue(ROOT, "the document root must be a mapping")])
    issues = Issues()
    parsed = parse_document(document, issues)
    ctx = Context(parsed, resolve_profiles(parsed.profiles, issues))
    for rule in RULES:
        rule(ctx, issues)
    if issues:
        raise ConfigError(issues.items)
    return build_snapshot(ctx)


def load_file(path: str | Path) -> EdgeSnapshot:
    """Read, parse and load a YAML or JSON config file."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError([ConfigIssue(ROOT, f"cannot read {path}: {exc.strerror}")]) from None
    return load_snapshot(parse_text(data))
