"""One rule for token counts reported by an upstream or a Node (R-IN-6); no Django.

A count is a non-negative integer below ``MAX_TOKENS``. Anything else (negative, huge,
not a number) is counted as 0 with one warning, so a single bad figure can neither stop
the usage ledger (a value past 64 bits fails every later database write of its batch) nor
fail the run that reported it (docs/metering.md).
"""

from __future__ import annotations

import logging
import math

from nodes import wire

log = logging.getLogger("iop.usage")

MAX_TOKENS = 10**12  # far above any real request, far below 2**63 after summing


def token_figure(value: object, field: str) -> int:
    """``value`` as a token count; 0 (with a log line) when it is not a plausible one."""
    if value is None:
        return 0
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and value.isascii() and value.strip().isdigit():
        number = int(value.strip()[:20])
    if number is None:
        log.warning("usage %s is not a number (%.40r); counted as 0", field, value)
        return 0
    if number < 0 or number >= MAX_TOKENS:
        log.warning("usage %s of %d is out of range; counted as 0", field, number)
        return 0
    return number


def sane_usage(usage: wire.Usage | None, where: str) -> wire.Usage | None:
    """``usage`` with every count checked (cached input tokens at most the input ones); the
    same object when all were fine."""
    if usage is None:
        return None
    inp, out, cached = usage.input_tokens, usage.output_tokens, usage.cached_input_tokens
    if (
        type(inp) is int and type(out) is int and type(cached) is int
        and 0 <= inp < MAX_TOKENS and 0 <= out < MAX_TOKENS and 0 <= cached <= inp
    ):  # fmt: skip
        return usage
    inp = token_figure(inp, f"{where} input_tokens")
    return wire.Usage(
        input_tokens=inp,
        output_tokens=token_figure(out, f"{where} output_tokens"),
        estimated=usage.estimated,
        cached_input_tokens=min(token_figure(cached, f"{where} cached_input_tokens"), inp),
    )
