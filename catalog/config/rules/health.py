"""Provider health settings (R-HEALTH-1..3): defaults, bounds that span two keys, probes."""

from __future__ import annotations

from catalog.config.errors import Issues
from catalog.config.rules.context import DEFAULT_EJECT_BASE_S, DEFAULT_EJECT_MAX_S, Context
from catalog.config.schema import ProviderPoolDoc

MIN_PROBE_INTERVAL_S = 1.0


def resolve_health(ctx: Context, issues: Issues) -> None:
    """Apply the documented defaults; ``eject_max_s`` may not be below ``eject_base_s``."""
    pool = ctx.parsed.section("provider_pool", ProviderPoolDoc)
    if pool is None:
        return
    if pool.retry_before_first_byte is not None:
        ctx.retry_before_first_byte = pool.retry_before_first_byte
    if pool.eject_after_failures is not None:
        ctx.eject_after_failures = pool.eject_after_failures
    base = DEFAULT_EJECT_BASE_S if pool.eject_base_s is None else pool.eject_base_s
    top = max(DEFAULT_EJECT_MAX_S, base) if pool.eject_max_s is None else pool.eject_max_s
    if top < base:
        issues.add(
            ("provider_pool", "eject_max_s"), f"must be >= eject_base_s ({base:g}), got {top:g}"
        )
        return
    ctx.eject_base_s, ctx.eject_max_s = base, top


def check_probes(ctx: Context, issues: Issues) -> None:
    """A probe interval is 0 (off) or at least a second; ``probe_command`` is for cli only."""
    for item, doc in ctx.valid_providers():
        interval = doc.probe_interval_s
        if interval is not None and 0 < interval < MIN_PROBE_INTERVAL_S:
            issues.add(
                (*item.path, "probe_interval_s"),
                f"must be 0 (off) or >= {MIN_PROBE_INTERVAL_S:g}, got {interval:g}",
            )
        profile = ctx.provider_profiles.get(item.path)
        if profile is None or doc.probe_command is None:
            continue
        if profile.adapter != "cli":
            issues.add((*item.path, "probe_command"), "is only for cli providers")
