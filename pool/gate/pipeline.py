"""A request's chain of gate filters: text in, releasable text out (R-SEG-5, R-SEG-8)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .repeat_guard import Repeat, RepeatGuard


@dataclass(frozen=True, slots=True)
class GateVerdict:
    """What one feed allows: text to release now, and the filter that fired (if any)."""

    release: str
    fired: str | None = None  # filter type that fired and enforces
    observed: str | None = None  # filter type that fired in observe mode
    evidence: Repeat | None = None


@dataclass(frozen=True, slots=True)
class FilterSpec:
    """The settings of one filter as the pipeline needs them."""

    type: str
    hold_evidence_runes: int
    observe: bool = False


class FilterPipeline:
    """Filters applied in order: what one releases is what the next one is fed."""

    __slots__ = ("_filters", "_observed")

    def __init__(self, specs: Iterable[FilterSpec]) -> None:
        self._filters: list[tuple[str, RepeatGuard]] = []
        for spec in specs:
            if spec.type != "repeat_guard":
                raise ValueError(f"unknown stream filter type {spec.type!r}")
            self._filters.append((spec.type, RepeatGuard(spec.hold_evidence_runes, spec.observe)))
        self._observed: set[int] = set()

    def feed(self, text: str) -> GateVerdict:
        """Pass ``text`` through every filter; stop at the first that fires and enforces."""
        observed: tuple[str, Repeat] | None = None
        for index, (kind, guard) in enumerate(self._filters):
            text = guard.feed(text)
            if guard.evidence is None:
                continue
            if not guard.observe:
                return GateVerdict("", fired=kind, evidence=guard.evidence)
            if index not in self._observed:  # report an observed repeat once per request
                self._observed.add(index)
                observed = (kind, guard.evidence)
        if observed is not None:
            return GateVerdict(text, observed=observed[0], evidence=observed[1])
        return GateVerdict(text)

    def finish(self) -> GateVerdict:
        """The stream ended: flush each filter in order, feeding what it releases onward."""
        text = ""
        for kind, guard in self._filters:
            text = guard.feed(text) if text else ""
            if guard.evidence is not None and not guard.observe:
                return GateVerdict("", fired=kind, evidence=guard.evidence)
            text += guard.finish()
        return GateVerdict(text)
