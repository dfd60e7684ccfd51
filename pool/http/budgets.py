"""Budgets checked at admission (R-BUD-1, R-LIM-1: ``pool.http.admission`` asks at the
headers, to refuse early, and again after the body, to decide), beside the limiters.

A principal's budget is ``{tokens, period}`` stated in its ``principals:`` entry or on one of
its tokens; it holds for every token and route key of that principal, in both modes
(catalog/config/rules/budgets.py, R-MGD-13). When a request
of a budgeted principal is admitted, the figure the meter keeps in memory
(``pool.metering.budget_view``) is compared with it: no I/O on the request path. Once the
principal's metered tokens in the current UTC period reach the budget, its requests get 429
``budget_exceeded`` with ``Retry-After`` (seconds to the period's end); every answer to a
budgeted principal carries ``x-budget-limit-tokens``, ``x-budget-remaining-tokens`` and
``x-budget-reset`` (the period's end, RFC 3339 UTC). A request admitted before the budget was
reached runs to its end, so the overshoot is at most the requests then in flight
(docs/http-api.md, "Budgets").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime

from catalog.config import EdgeSnapshot
from pool.http.errors import HttpError
from pool.metering.budget_view import BudgetView

Headers = list[tuple[bytes, bytes]]


class Budgets:
    """The budgets of the active snapshot, checked against the meter's view."""

    __slots__ = ("_clock", "_limits", "_resets", "_view")

    def __init__(self, view: BudgetView, clock: Callable[[], float] = time.time) -> None:
        self._view = view
        self._clock = clock
        self._limits: dict[str, int] = {}  # principal_ref -> tokens per period
        self._resets: dict[int, bytes] = {}  # a period's end -> its x-budget-reset value

    def limits_of(self, snapshot: EdgeSnapshot) -> dict[str, str]:
        """Take the snapshot's budgets (live); the principals' periods, for the meter's view."""
        periods: dict[str, str] = {}
        limits: dict[str, int] = {}
        budgets = [(t.principal_ref, t.budget) for t in snapshot.principal_tokens]
        budgets += [(p.id, p.budget) for p in snapshot.principals.values()]  # R-MGD-13
        for principal_ref, budget in budgets:
            if budget is not None:
                limits[principal_ref] = budget.tokens
                periods[principal_ref] = budget.period
        self._limits = limits
        return periods

    def admit(self, principal_ref: str | None) -> Headers | None:
        """The ``x-budget-*`` headers of a budgeted principal (None: no budget), or raise
        ``budget_exceeded`` once its period's tokens reached the budget."""
        limit = self._limits.get(principal_ref) if principal_ref is not None else None
        if limit is None or principal_ref is None:
            return None
        now = self._clock()
        used, _, end = self._view.used(principal_ref, now)
        remaining = max(0, limit - used)
        reset = self._resets.get(end)
        if reset is None:
            if len(self._resets) > 8:  # a handful of period ends are current at any time
                self._resets.clear()
            stamp = datetime.fromtimestamp(end, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            reset = self._resets[end] = stamp.encode()
        headers = [
            (b"x-budget-limit-tokens", str(limit).encode()),
            (b"x-budget-remaining-tokens", b"%d" % remaining),
            (b"x-budget-reset", reset),
        ]
        if remaining <= 0:
            wait = max(1, math.ceil(end - now))
            raise HttpError(
                "budget_exceeded",
                f"the token budget of this principal ({limit} tokens per period) is spent "
                f"until {reset.decode()}",
                headers=[(b"retry-after", b"%d" % wait), *headers],
            )
        return headers
