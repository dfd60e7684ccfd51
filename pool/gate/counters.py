"""Gate outcomes per provider, for ``/metrics`` and the status page (R-SEG-6, R-SEG-8)."""

from __future__ import annotations

FIRED, RECOVERED, EXHAUSTED, OBSERVED = "fired", "recovered", "exhausted", "observed"
OUTCOMES = (FIRED, RECOVERED, EXHAUSTED, OBSERVED)


class GateCounts:
    """Counters that only grow: (provider id, outcome) -> count. Owned by the runtime."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}

    def add(self, provider_id: str, outcome: str) -> None:
        key = (provider_id, outcome)
        self._counts[key] = self._counts.get(key, 0) + 1

    def items(self) -> list[tuple[str, str, int]]:
        """(provider id, outcome, count), sorted."""
        return sorted((p, o, n) for (p, o), n in self._counts.items())

    def by_provider(self) -> dict[str, dict[str, int]]:
        """provider id -> every outcome's count (zeros included)."""
        table: dict[str, dict[str, int]] = {}
        for (provider_id, outcome), count in self._counts.items():
            table.setdefault(provider_id, dict.fromkeys(OUTCOMES, 0))[outcome] = count
        return table
