"""What each budgeted principal used in its current period (R-BUD-1, R-COST-3), in memory.

A principal's budget counts tokens or money (10^-12 of ``metering.currency``, the meter's
``cost_pico``); the view keeps, per principal, the figure in its budget's unit. ``used()`` is
read before every admission of a budgeted principal and costs no I/O: it is the ledger's
figure at the last read plus this Edge's usage not in that figure. The meter feeds ``add()``
from every record and calls ``refreshed()`` after each flush, under its flush lock, so no
batch is half-written while the ledger is read: the ledger then holds everything flushed (by
every Edge) and this Edge's pending map holds everything else, and each is counted once.

A budget new to this view (added live, or its period or unit changed) has not been read yet:
``unread()`` says so, and admission waits for the first read (``read()``) before it admits
the principal, so usage already in the ledger counts at once (docs/metering.md).

Across Edges the figure lags by at most one flush interval of the other Edges plus one
refresh interval of this one (docs/metering.md). A read that fails keeps the last figure and
goes on adding this Edge's own usage: budgets keep being enforced on what is known.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from catalog.config.periods import PERIODS, period_bounds
from pool.metering.pending import Counts, UsageKey


class Counted(NamedTuple):
    """How a principal's budget counts: its period, and money (True) or tokens."""

    period: str
    money: bool = False


# (period, money) -> (principals, period start in epoch seconds); figures by principal
Wanted = dict[tuple[str, bool], tuple[frozenset[str], int]]
Reader = Callable[[Wanted], dict[str, int]]


class BudgetView:
    """Per budgeted principal: the ledger figure of its period and this Edge's unflushed usage."""

    __slots__ = ("_bounds", "_kinds", "_ledger", "_unflushed", "_waiters")

    def __init__(self) -> None:
        self._bounds: dict[str, tuple[int, int]] = {}  # period -> the current (start, end)
        self._kinds: dict[str, Counted] = {}  # principal_ref -> how its budget counts
        self._ledger: dict[str, tuple[int, int]] = {}  # principal -> (period start, figure)
        self._unflushed: dict[str, dict[int, int]] = {}  # principal -> hour bucket -> figure
        self._waiters: list[asyncio.Future[None]] = []  # admissions waiting for a first read

    @property
    def empty(self) -> bool:
        return not self._kinds

    def configure(self, kinds: Mapping[str, Counted]) -> bool:
        """The budgeted principals and how each counts (from the snapshot); True when one is
        new or counts otherwise, so its figure should be read soon. Until then it is
        ``unread``."""
        changed = [p for p, kind in kinds.items() if self._kinds.get(p) != kind]
        for ref in changed:  # a figure of another period or unit is no figure of this one
            self._ledger.pop(ref, None)
            self._unflushed.pop(ref, None)
        self._kinds = dict(kinds)
        for gone in [p for p in self._unflushed if p not in kinds]:
            del self._unflushed[gone]
        for gone in [p for p in self._ledger if p not in kinds]:
            del self._ledger[gone]
        return bool(changed)

    def unread(self, principal_ref: str) -> bool:
        """A budgeted principal whose figure the ledger has not given yet."""
        return principal_ref in self._kinds and principal_ref not in self._ledger

    async def read(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) for the next ledger read to be installed."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except TimeoutError:
            pass
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def add(self, principal_ref: str, bucket: int, tokens: int, cost_pico: int) -> None:
        """One record's tokens and cost, the moment it is metered (O(1))."""
        kind = self._kinds.get(principal_ref)
        if kind is None:
            return
        figure = cost_pico if kind.money else tokens
        if figure:
            hours = self._unflushed.setdefault(principal_ref, {})
            hours[bucket] = hours.get(bucket, 0) + figure

    def used(self, principal_ref: str, now_s: float) -> tuple[int, int, int]:
        """(figure used in the current period, period start, period end)."""
        kind = self._kinds.get(principal_ref)
        start, end = self.bounds(kind.period if kind is not None else "month", now_s)
        read = self._ledger.get(principal_ref)
        total = read[1] if read is not None and read[0] == start else 0
        hours = self._unflushed.get(principal_ref)
        if hours:
            for bucket, figure in hours.items():  # one or two hours: no generator
                if bucket >= start:
                    total += figure
        return total, start, end

    def bounds(self, period: str, now_s: float) -> tuple[int, int]:
        """``period_bounds``, computed once per period (admissions read it every time)."""
        found = self._bounds.get(period)
        if found is None or not found[0] <= now_s < found[1]:
            found = self._bounds[period] = period_bounds(period, now_s)
        return found

    def wanted(self, now_s: float) -> Wanted:
        """What to read from the ledger: per period and unit, its principals and the start."""
        out: Wanted = {}
        for period in PERIODS:
            start = period_bounds(period, now_s)[0]
            for money in (False, True):
                refs = frozenset(p for p, k in self._kinds.items() if k == (period, money))
                if refs:
                    out[(period, money)] = (refs, start)
        return out

    def refreshed(
        self,
        wanted: Mapping[tuple[str, bool], tuple[frozenset[str], int]],
        figures: Mapping[str, int],
        pending: Iterable[tuple[UsageKey, Counts]],
    ) -> None:
        """Install a ledger read and recount the unflushed usage from the meter's pending map
        (both taken while no batch was being written); admissions waiting for it go on."""
        for (period, money), (refs, start) in wanted.items():
            for ref in refs:
                if self._kinds.get(ref) == (period, money):  # not changed while it was read
                    self._ledger[ref] = (start, figures.get(ref, 0))
        unflushed: dict[str, dict[int, int]] = {}
        for key, counts in pending:
            kind = self._kinds.get(key.principal_ref)
            if kind is not None:
                hours = unflushed.setdefault(key.principal_ref, {})
                figure = (
                    counts.cost_pico if kind.money else counts.input_tokens + counts.output_tokens
                )
                hours[key.bucket] = hours.get(key.bucket, 0) + figure
        self._unflushed = unflushed
        self.release()

    def read_failed(self, now_s: float) -> None:
        """The ledger could not be read: an unread principal starts from this Edge's own
        usage (enforced on what is known) rather than keep its admissions waiting."""
        for ref, kind in self._kinds.items():
            if ref not in self._ledger:
                self._ledger[ref] = (self.bounds(kind.period, now_s)[0], 0)
        self.release()

    def release(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


def read_in_worker(wanted: Wanted) -> dict[str, int]:
    """Tokens or cost per principal since each period's start, from the ledger (a worker
    thread)."""
    from django.db import connections
    from django.db.models import F, Sum

    from pool.metering.models import UsageBucket
    from pool.metering.store import bucket_datetime

    figures: dict[str, int] = {}
    try:
        for (_, money), (refs, start) in wanted.items():
            figure = Sum("cost_pico") if money else Sum(F("input_tokens") + F("output_tokens"))
            rows = (
                UsageBucket.objects.filter(
                    principal_ref__in=refs, bucket_start__gte=bucket_datetime(start)
                )
                .values("principal_ref")
                .annotate(figure=figure)
            )
            for row in rows:
                figures[row["principal_ref"]] = int(row["figure"] or 0)
        return figures
    finally:
        connections.close_all()
