"""What each budgeted principal used in its current period (R-BUD-1), kept in memory.

``used()`` is read before every admission of a budgeted principal and costs no I/O: it is the
ledger's figure at the last read plus this Edge's usage not in that figure. The meter feeds
``add()`` from every record and calls ``refresh()`` after each flush, under its flush lock, so
no batch is half-written while the ledger is read: the ledger then holds everything flushed
(by every Edge) and this Edge's pending map holds everything else, and each is counted once.

Across Edges the figure lags by at most one flush interval of the other Edges plus one
refresh interval of this one (docs/metering.md). A read that fails keeps the last figure and
goes on adding this Edge's own usage: budgets keep being enforced on what is known.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from catalog.config.periods import PERIODS, period_bounds
from pool.metering.pending import Counts, UsageKey

# period -> (principals, period start in epoch seconds) -> {principal: tokens}
Reader = Callable[[dict[str, tuple[frozenset[str], int]]], dict[str, int]]


class BudgetView:
    """Per budgeted principal: the ledger figure of its period and this Edge's unflushed usage."""

    __slots__ = ("_bounds", "_ledger", "_periods", "_unflushed")

    def __init__(self) -> None:
        self._bounds: dict[str, tuple[int, int]] = {}  # period -> the current (start, end)
        self._periods: dict[str, str] = {}  # principal_ref -> its budget's period
        self._ledger: dict[str, tuple[int, int]] = {}  # principal -> (period start, tokens)
        self._unflushed: dict[str, dict[int, int]] = {}  # principal -> hour bucket -> tokens

    @property
    def empty(self) -> bool:
        return not self._periods

    def configure(self, periods: Mapping[str, str]) -> bool:
        """The budgeted principals and their periods (from the snapshot); True when a
        principal or a period is new, so its figure should be read soon."""
        new = any(self._periods.get(p) != period for p, period in periods.items())
        self._periods = dict(periods)
        for gone in [p for p in self._unflushed if p not in periods]:
            del self._unflushed[gone]
        for gone in [p for p in self._ledger if p not in periods]:
            del self._ledger[gone]
        return new

    def add(self, principal_ref: str, bucket: int, tokens: int) -> None:
        """One record's tokens, the moment it is metered (O(1))."""
        if tokens and principal_ref in self._periods:
            hours = self._unflushed.setdefault(principal_ref, {})
            hours[bucket] = hours.get(bucket, 0) + tokens

    def used(self, principal_ref: str, now_s: float) -> tuple[int, int, int]:
        """(tokens used in the current period, period start, period end)."""
        start, end = self.bounds(self._periods.get(principal_ref, "month"), now_s)
        read = self._ledger.get(principal_ref)
        total = read[1] if read is not None and read[0] == start else 0
        hours = self._unflushed.get(principal_ref)
        if hours:
            for bucket, tokens in hours.items():  # one or two hours: no generator
                if bucket >= start:
                    total += tokens
        return total, start, end

    def bounds(self, period: str, now_s: float) -> tuple[int, int]:
        """``period_bounds``, computed once per period (admissions read it every time)."""
        found = self._bounds.get(period)
        if found is None or not found[0] <= now_s < found[1]:
            found = self._bounds[period] = period_bounds(period, now_s)
        return found

    def wanted(self, now_s: float) -> dict[str, tuple[frozenset[str], int]]:
        """What to read from the ledger: per period, its principals and the period start."""
        out: dict[str, tuple[frozenset[str], int]] = {}
        for period in PERIODS:
            refs = frozenset(p for p, kind in self._periods.items() if kind == period)
            if refs:
                out[period] = (refs, period_bounds(period, now_s)[0])
        return out

    def refreshed(
        self,
        wanted: Mapping[str, tuple[frozenset[str], int]],
        figures: Mapping[str, int],
        pending: Iterable[tuple[UsageKey, Counts]],
    ) -> None:
        """Install a ledger read and recount the unflushed usage from the meter's pending map
        (both taken while no batch was being written)."""
        for refs, start in wanted.values():
            for ref in refs:
                self._ledger[ref] = (start, figures.get(ref, 0))
        unflushed: dict[str, dict[int, int]] = {}
        for key, counts in pending:
            if key.principal_ref in self._periods:
                hours = unflushed.setdefault(key.principal_ref, {})
                tokens = counts.input_tokens + counts.output_tokens
                hours[key.bucket] = hours.get(key.bucket, 0) + tokens
        self._unflushed = unflushed


def read_in_worker(wanted: dict[str, tuple[frozenset[str], int]]) -> dict[str, int]:
    """Tokens per principal since each period's start, from the ledger (a worker thread)."""
    from django.db import connections
    from django.db.models import F, Sum

    from pool.metering.models import UsageBucket
    from pool.metering.store import bucket_datetime

    figures: dict[str, int] = {}
    try:
        for refs, start in wanted.values():
            rows = (
                UsageBucket.objects.filter(
                    principal_ref__in=refs, bucket_start__gte=bucket_datetime(start)
                )
                .values("principal_ref")
                .annotate(tokens=Sum(F("input_tokens") + F("output_tokens")))
            )
            for row in rows:
                figures[row["principal_ref"]] = int(row["tokens"] or 0)
        return figures
    finally:
        connections.close_all()
