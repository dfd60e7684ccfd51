"""Catalog rules: unique ids, model references, served models, long-context budget."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from catalog.config.errors import Issues, format_path
from catalog.config.parsed import Item
from catalog.config.rules.context import Context


def _duplicates(kind: str, items: Iterable[Item], issues: Issues) -> None:
    first: dict[str, Item] = {}
    for item in items:
        key = item.raw_id
        if key is None:
            continue
        if key in first:
            where = format_path(first[key].path)
            issues.add((*item.path, "id"), f"duplicate {kind} id {key!r} (first at {where})")
        else:
            first[key] = item


def check_unique_ids(ctx: Context, issues: Issues) -> None:
    """Node ids and model ids are unique; provider ids across ALL nodes (R-CFG-3)."""
    _duplicates("node", (node.item for node in ctx.parsed.nodes), issues)
    _duplicates("provider", ctx.parsed.providers(), issues)
    _duplicates("model", ctx.parsed.models, issues)
    _duplicates("principal", ctx.parsed.principals, issues)  # R-MGD-13


def check_model_references(ctx: Context, issues: Issues) -> None:
    """Every ``models[].providers`` key names a configured provider (R-CFG-5)."""
    known = {item.raw_id for item in ctx.parsed.providers()}
    for model in ctx.parsed.models:
        mapping = model.raw.get("providers")
        if not isinstance(mapping, Mapping):
            continue
        for provider_id in mapping:
            if isinstance(provider_id, str) and provider_id not in known:
                issues.add((*model.path, "providers", provider_id), "unknown provider id")


def check_served_models(ctx: Context, issues: Issues) -> None:
    """A served model must agree with the provider profile's ``model_mapping`` (R-PROF-5)."""
    profiles = {
        item.raw_id: ctx.provider_profiles.get(item.path) for item in ctx.parsed.providers()
    }
    for model in ctx.parsed.models:
        if model.doc is None:
            continue
        for provider_id, served in model.doc.providers.items():
            profile = profiles.get(provider_id)
            if profile is None or model.doc.id not in profile.model_mapping:
                continue
            mapped = profile.model_mapping[model.doc.id]
            if mapped != served:
                issues.add(
                    (*model.path, "providers", provider_id),
                    f"profile {profile.name} maps {model.doc.id!r} to {mapped!r}, not {served!r}",
                )


def check_long_context_budget(ctx: Context, issues: Issues) -> None:
    """R-CFG-8: 0 <= long_context_capacity <= capacity; long slots need a large enough window."""
    openai = ctx.openai
    threshold = openai.long_context_threshold_tokens if openai else None
    for item, doc in ctx.valid_providers():
        if doc.long_context_capacity > doc.capacity:
            issues.add(
                (*item.path, "long_context_capacity"), f"must be <= capacity ({doc.capacity})"
            )
        if doc.long_context_capacity == 0:
            continue
        if doc.context_window_tokens is None:
            issues.add(
                (*item.path, "context_window_tokens"),
                "is required when long_context_capacity > 0",
            )
        elif threshold is not None and doc.context_window_tokens < threshold:
            issues.add(
                (*item.path, "context_window_tokens"),
                f"must be >= long_context_threshold_tokens ({threshold}) "
                "when long_context_capacity > 0",
            )
