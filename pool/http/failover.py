"""What a failed attempt means for the request and for its provider (R-HEALTH-1, R-HEALTH-2).

Pure: a Node's ``RunError`` in, a ``Verdict`` out. Reasons name a kind of failure, never an
upstream address (they reach logs, ``/pool`` and 503 messages).
"""

from __future__ import annotations

from dataclasses import dataclass

from nodes import wire

SUCCESS, FAILURE, NEUTRAL = "success", "failure", "neutral"
_PROVIDER_FAULTS = frozenset({"upstream_error", "upstream_timeout"})


@dataclass(frozen=True, slots=True)
class Verdict:
    """``health``: what the attempt tells about its provider; ``retry``: another provider may
    take the request; ``reached``: the upstream saw the request (metering)."""

    health: str
    retry: bool = False
    reason: str = ""
    retry_after_s: float | None = None
    reached: bool = True


ANSWERED = Verdict(SUCCESS)
UNKNOWN = Verdict(NEUTRAL)
NODE_NOT_CONNECTED = Verdict(NEUTRAL, retry=True, reached=False)


def verdict_of(error: wire.RunError | None) -> Verdict:
    """A run failure read for health and failover."""
    if error is None:
        return UNKNOWN
    if error.before_first_byte:
        reached = error.phase != wire.PHASE_CONNECT
        if error.code not in _PROVIDER_FAULTS:
            return Verdict(NEUTRAL, retry=True, reached=reached)  # e.g. the Node is stopping
        return Verdict(FAILURE, True, error.reason, error.retry_after_s, reached)
    if error.status is not None and error.phase == wire.PHASE_BEFORE_FIRST_BYTE:
        return ANSWERED  # a 4xx: the upstream is up and refused this request
    return UNKNOWN
