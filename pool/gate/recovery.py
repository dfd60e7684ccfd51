"""Which recovery a fired gate takes next, and the request it re-issues (R-SEG-4, R-SEG-6).

Pure. The order is fixed per request (docs/stream-evidence-gate.md, "Recovery"): ``resample``
while its cap allows, then ``switch_provider``; the n-th resample of a request takes the n-th
temperature candidate.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

RESAMPLE = "resample"
SWITCH_PROVIDER = "switch_provider"
STRATEGIES = (RESAMPLE, SWITCH_PROVIDER)
# Every value is valid for the OpenAI (0..2) and Anthropic (0..1) APIs alike.
TEMPERATURE_CANDIDATES = (1.0, 0.7, 0.4, 0.1)


class RecoveryPlan:
    """One request's recovery budget: ``request_fault_recovery`` and each strategy cap."""

    __slots__ = ("_caps", "_left", "_used", "temperatures")

    def __init__(
        self, total: int, caps: Mapping[str, int], client_temperature: object = None
    ) -> None:
        self._left = total
        self._caps = {name: min(total, caps.get(name, total)) for name in STRATEGIES}
        self._used = dict.fromkeys(STRATEGIES, 0)
        # A candidate equal to the client's own temperature would resample the same way.
        self.temperatures = tuple(t for t in TEMPERATURE_CANDIDATES if t != client_temperature)

    def next(self, can_switch: bool) -> str | None:
        """The strategy of the next recovery, or None when recovery is exhausted; uses it."""
        if self._left <= 0:
            return None
        for name in STRATEGIES:
            if self._used[name] >= self._caps[name]:
                continue
            if name == SWITCH_PROVIDER and not can_switch:
                continue
            self._used[name] += 1
            self._left -= 1
            return name
        return None

    def temperature(self) -> float:
        """The temperature of the resample just chosen by ``next`` (1st, 2nd, ... candidate)."""
        return self.temperatures[(self._used[RESAMPLE] - 1) % len(self.temperatures)]


def continuation(
    snapshot: Mapping[str, Any], delivered: str, temperature: float | None
) -> dict[str, Any]:
    """The ingress snapshot with the delivered text as the assistant's partial answer."""
    data = copy.deepcopy(dict(snapshot))
    if delivered:
        data["messages"] = [*data["messages"], {"role": "assistant", "content": delivered}]
    if temperature is not None:
        data["temperature"] = temperature
    return data
