"""Admission is one decision at one moment (R-LIM-1, R-LIM-2; docs/http-api.md, "Admission").

``arrive`` runs once the headers are authenticated: the request counts in flight for its
token from then on (in Redis too when the limits are shared, R-SCALE-6) and as one of the
token's bodies still arriving, of which it may hold ``max_pending_bodies``; the next gets 429
before its body is read. A spent budget refuses early there too. Nothing is admitted then:
``decide`` runs after the body is read and decides budget, ``max_in_flight``, ``rpm`` and
``tpm`` on the state at that moment, counting the other requests still sending their bodies.
``finish`` gives everything back exactly once, however the request ended.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pool.http.auth import Caller
from pool.http.budgets import Budgets, Headers
from pool.http.errors import HttpError
from pool.http.limits import LimitsUnavailable, RateLimited, Ticket, TokenLimiter

if TYPE_CHECKING:
    from pool.http.limits_shared import SharedTicket, SharedTokenLimiter

LEGACY_KEY = ""  # the legacy ``bearer_token``'s counters: no token ref can be empty


class Arrival:
    """One request's place in the counters, from its headers to its end."""

    __slots__ = ("headers", "local", "shared")

    def __init__(self, local: Ticket, shared: SharedTicket | None, headers: Headers) -> None:
        self.local = local
        self.shared = shared
        self.headers = headers  # x-budget-* as of the headers: answers before admission


class Admission:
    """The per-token counters of this Edge (and in Redis, shared) and the budgets."""

    __slots__ = ("budgets", "limiter", "shared")

    def __init__(
        self, limiter: TokenLimiter, shared: SharedTokenLimiter | None, budgets: Budgets
    ) -> None:
        self.limiter = limiter  # R-PRIN-2: this Edge's counters; bodies arriving always here
        self.shared = shared  # R-SCALE-6: in-flight, rpm and tpm across Edges instead
        self.budgets = budgets  # R-BUD-1: from the meter's view

    def arrive(self, caller: Caller) -> Arrival:
        """Headers authenticated: refuse early (budget spent, too many bodies arriving) or
        count the request from now on. Never admits."""
        budget = self.budgets.admit(caller.principal_ref)  # may refuse early; decided later
        key = caller.token_ref if caller.token_ref is not None else LEGACY_KEY
        try:
            local = self.limiter.arrive(key, caller.max_pending_bodies)  # R-LIM-2
        except RateLimited as exc:
            raise HttpError("rate_limited", str(exc), headers=exc.headers()) from None
        shared = None
        if self.shared is not None and caller.limits is not None and caller.token_ref:
            shared = self.shared.arrive(caller.token_ref)  # R-LIM-1 across Edges
        return Arrival(local, shared, budget or [])

    async def decide(self, caller: Caller, arrival: Arrival, estimate: int) -> Headers:
        """The body is read: the one decision. Returns the headers every answer carries
        (``x-budget-*``, ``x-ratelimit-*``), or raises the refusal."""
        limits = caller.limits
        try:
            headers = self.budgets.admit(caller.principal_ref) or []  # R-BUD-1, at admission
            if self.shared is None or arrival.shared is None:
                self.limiter.decide(arrival.local, limits, estimate)
                quota = arrival.local.quota
            else:
                assert limits is not None  # a shared slot is taken only for limited tokens
                self.limiter.decide(arrival.local, None, 0)  # only its body is done
                ticket = await self.shared.admit(
                    arrival.shared.token_ref, limits, estimate, arrival.shared
                )
                quota = ticket.quota
        except HttpError:
            self.finish(arrival, 0)
            raise
        except RateLimited as exc:
            self.finish(arrival, 0)  # at once: requests deciding together count it no more
            refused = exc.headers() + headers
            raise HttpError("rate_limited", str(exc), headers=refused) from None
        except LimitsUnavailable:
            self.finish(arrival, 0)
            raise HttpError("pool_unavailable", headers=headers) from None
        return headers + quota.headers() if quota is not None else headers

    def finish(self, arrival: Arrival, spent: int) -> None:
        """The request ended: its counts come back, its charge settled to ``spent``."""
        self.limiter.finish(arrival.local, spent)
        if arrival.shared is not None and self.shared is not None:
            self.shared.finish(arrival.shared, spent)
