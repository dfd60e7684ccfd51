"""R-CFG-7: the one root queue policy, with legacy per-provider keys promoted to it."""

from __future__ import annotations

from catalog.config.errors import Issues, format_path
from catalog.config.rules.context import DEFAULT_MAX_QUEUE, DEFAULT_QUEUE_TIMEOUT_MS, Context
from catalog.config.schema import ProviderPoolDoc


def _legacy_value(ctx: Context, key: str, issues: Issues, *, zero_is_unset: bool) -> int | None:
    """The value all providers agree on for legacy ``key``; None when unset or in conflict."""
    found = {}
    for item, doc in ctx.valid_providers():
        value = getattr(doc, key)
        if value is not None and not (zero_is_unset and value == 0):
            found[format_path(item.path)] = value
    if len(set(found.values())) > 1:
        listed = ", ".join(f"{path}={value}" for path, value in found.items())
        issues.add(
            ("provider_pool", key),
            f"legacy per-provider {key} values differ ({listed}); set provider_pool.{key}",
        )
        return None
    return next(iter(found.values()), None)


def promote_legacy_queue(ctx: Context, issues: Issues) -> None:
    """Resolve max_queue (0/omitted -> 16) and queue_timeout_ms (omitted -> 30000, 0 = none).

    Legacy per-provider keys count only when the root key is absent; the canonical document
    then carries the promoted value at the root and no legacy keys.
    """
    pool = ctx.parsed.section("provider_pool", ProviderPoolDoc)
    if pool is None:
        return
    max_queue = pool.max_queue or None  # an explicit 0 means "the default", like omitted
    if max_queue is None:
        max_queue = _legacy_value(ctx, "max_queue", issues, zero_is_unset=True)
    ctx.max_queue = max_queue or DEFAULT_MAX_QUEUE
    timeout = pool.queue_timeout_ms  # an explicit 0 means "no timeout"
    if timeout is None:
        timeout = _legacy_value(ctx, "queue_timeout_ms", issues, zero_is_unset=False)
    ctx.queue_timeout_ms = DEFAULT_QUEUE_TIMEOUT_MS if timeout is None else timeout
