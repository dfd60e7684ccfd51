"""Budgets checked at admission (R-BUD-1, R-LIM-1: ``pool.http.admission`` asks at the
headers, to refuse early, and again after the body, to decide), beside the limiters.

A principal's budget is ``{tokens, period}`` or ``{amount, period}`` (R-COST-3: an amount
of ``metering.currency``, counted in the meter's cost) stated in its ``principals:`` entry or
on one of its tokens; it holds for every token and route key of that principal, in both modes
(catalog/config/rules/budgets.py, R-MGD-13). When a request
of a budgeted principal is admitted, the figure the meter keeps in memory
(``pool.metering.budget_view``) is compared with it: no I/O on the request path. Once the
principal's metered tokens in the current UTC period reach the budget, its requests get 429
``budget_exceeded`` with ``Retry-After`` (seconds to the period's end); every answer to a
budgeted principal carries ``x-budget-limit-tokens``, ``x-budget-remaining-tokens`` and
``x-budget-reset`` (the period's end, RFC 3339 UTC); a budget in money carries
``x-budget-limit-amount``, ``x-budget-remaining-amount`` and ``x-budget-currency`` instead of
the two token headers. A budget the view has not read from the ledger yet (added live) is
admitted only after that read (``ready``), so usage already there counts at once. A request
admitted before the budget was reached runs to its end, so the overshoot is at most the
requests then in flight (docs/http-api.md, "Budgets").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from catalog.config import EdgeSnapshot
from catalog.config.money import pico_text
from pool.http.errors import HttpError
from pool.metering.budget_view import BudgetView, Counted

Headers = list[tuple[bytes, bytes]]
READ_WAIT_S = 5.0  # a new budget's first ledger read: at most this long (then what is known)


@dataclass(frozen=True, slots=True)
class BudgetLimit:
    """One principal's budget as admission reads it: the figure, its fixed headers, the name
    of the remaining header and the limit in words (for the refusal)."""

    limit: int
    money: bool
    headers: Headers
    remaining: bytes
    described: str

    @classmethod
    def of(cls, limit: int, money: bool, currency: str) -> BudgetLimit:
        if money:  # R-COST-3: in 10^-12 units of the currency, shown as a decimal
            shown = pico_text(limit)
            fixed = [(b"x-budget-limit-amount", shown.encode()),
                     (b"x-budget-currency", currency.encode())]  # fmt: skip
            return cls(limit, True, fixed, b"x-budget-remaining-amount", f"{shown} {currency}")
        shown = str(limit)
        fixed = [(b"x-budget-limit-tokens", shown.encode())]
        return cls(limit, False, fixed, b"x-budget-remaining-tokens", f"{shown} tokens")


class Budgets:
    """The budgets of the active snapshot, checked against the meter's view."""

    __slots__ = ("_clock", "_limits", "_resets", "_view")

    def __init__(self, view: BudgetView, clock: Callable[[], float] = time.time) -> None:
        self._view = view
        self._clock = clock
        # principal_ref -> its limit (tokens or 10^-12 units), built once per snapshot
        self._limits: dict[str, BudgetLimit] = {}
        self._resets: dict[int, bytes] = {}  # a period's end -> its x-budget-reset value

    def limits_of(self, snapshot: EdgeSnapshot) -> dict[str, Counted]:
        """Take the snapshot's budgets (live); how each principal's counts, for the view."""
        kinds: dict[str, Counted] = {}
        limits: dict[str, BudgetLimit] = {}
        budgets = [(t.principal_ref, t.budget) for t in snapshot.principal_tokens]
        budgets += [(p.id, p.budget) for p in snapshot.principals.values()]  # R-MGD-13
        for principal_ref, budget in budgets:
            if budget is None:
                continue
            limits[principal_ref] = BudgetLimit.of(budget.limit, budget.in_money, snapshot.currency)
            kinds[principal_ref] = Counted(budget.period, budget.in_money)
        self._limits = limits
        return kinds

    async def ready(self, principal_ref: str | None) -> None:
        """A budget not read from the ledger yet (added live): wait for that read, bounded
        (docs/metering.md, "Budgets"); at once otherwise."""
        if principal_ref is not None and self._view.unread(principal_ref):
            await self._view.read(READ_WAIT_S)

    def admit(self, principal_ref: str | None) -> Headers | None:
        """The ``x-budget-*`` headers of a budgeted principal (None: no budget), or raise
        ``budget_exceeded`` once its period's tokens or cost reached the budget."""
        found = self._limits.get(principal_ref) if principal_ref is not None else None
        if found is None or principal_ref is None:
            return None
        limit = found.limit
        now = self._clock()
        used, _, end = self._view.used(principal_ref, now)
        remaining = max(0, limit - used)
        reset = self._resets.get(end)
        if reset is None:
            if len(self._resets) > 8:  # a handful of period ends are current at any time
                self._resets.clear()
            stamp = datetime.fromtimestamp(end, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            reset = self._resets[end] = stamp.encode()
        left = pico_text(remaining).encode() if found.money else b"%d" % remaining
        headers = [*found.headers, (found.remaining, left), (b"x-budget-reset", reset)]
        if remaining <= 0:
            wait = max(1, math.ceil(end - now))
            raise HttpError(
                "budget_exceeded",
                f"the budget of this principal ({found.described} per period) is spent "
                f"until {reset.decode()}",
                headers=[(b"retry-after", b"%d" % wait), *headers],
            )
        return headers
