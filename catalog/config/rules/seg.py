"""Stream Evidence Gate rules (R-SEG-2): each strategy cap is within the request total."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from catalog.config.errors import Issues
from catalog.config.rules.context import Context


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_stream_evidence_gate(ctx: Context, issues: Issues) -> None:
    """Each ``strategy_caps`` value is <= ``request_fault_recovery`` (default 1).

    Reads the values as written, so the rule still runs when another gate key is invalid;
    values of the wrong type are reported by the schema and skipped here.
    """
    gate = ctx.parsed.raw_sections["openai"].get("stream_evidence_gate")
    if not isinstance(gate, Mapping):
        return
    total = _int(gate.get("request_fault_recovery", 1))
    caps = gate.get("strategy_caps")
    if total is None or not 0 <= total <= 3 or not isinstance(caps, Mapping):
        return
    for strategy, raw_cap in caps.items():
        cap = _int(raw_cap)
        if cap is not None and cap > total:
            issues.add(
                ("openai", "stream_evidence_gate", "strategy_caps", str(strategy)),
                f"must be <= request_fault_recovery ({total})",
            )
