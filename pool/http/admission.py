"""Admission is one decision at one moment (R-LIM-1, R-LIM-2, R-MGD-13; docs/http-api.md,
"Admission").

``arrive`` runs once the headers are authenticated: the request counts in flight for its
token and its principal from then on (in Redis too when the limits are shared, R-SCALE-6)
and as one of the token's bodies still arriving, of which it may hold
``max_pending_bodies``; the next gets 429 before its body is read. A spent budget refuses
early there too. Nothing is admitted then: ``decide`` runs after the body is read and
decides budget, then the token's and the principal's ``max_in_flight``, ``rpm`` and ``tpm``,
on the state at that moment, counting the other requests still sending their bodies.
``finish`` gives everything back exactly once, however the request ended.

A principal's counters (``principals:``, over all its tokens and route keys) sit in the same
limiters as a token's, under a key no token ref can take (a leading space).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from catalog.config import EdgeSnapshot
from pool.http.auth import Caller
from pool.http.budgets import Budgets, Headers
from pool.http.errors import HttpError
from pool.http.limits import (
    LimitsUnavailable,
    Quota,
    RateLimited,
    Ticket,
    TokenLimiter,
    TokenLimits,
)
from pool.metering.budget_view import Counted

if TYPE_CHECKING:
    from pool.http.limits_shared import SharedTicket, SharedTokenLimiter

LEGACY_KEY = ""  # the legacy ``bearer_token``'s counters: no token ref can be empty


def principal_key(principal_ref: str) -> str:
    """The counters key of a principal (R-MGD-13): never a token ref (those cannot start
    with a space)."""
    return " " + principal_ref


class _Counted:
    """One key's place in the counters: this Edge's ticket and, shared, its Redis slot."""

    __slots__ = ("key", "limits", "local", "shared", "who")

    def __init__(self, who: str, key: str, limits: TokenLimits | None, local: Ticket,
                 shared: SharedTicket | None) -> None:  # fmt: skip
        self.who, self.key, self.limits, self.local, self.shared = who, key, limits, local, shared


class Arrival:
    """One request's place in the counters, from its headers to its end."""

    __slots__ = ("counted", "headers")

    def __init__(self, counted: list[_Counted], headers: Headers) -> None:
        self.counted = counted  # the token's, then the principal's (when it has limits)
        self.headers = headers  # x-budget-* as of the headers: answers before admission


class Admission:
    """The per-token and per-principal counters of this Edge (and in Redis, shared) and the
    budgets, for the active snapshot."""

    __slots__ = ("_principals", "_queues", "budgets", "limiter", "shared")

    def __init__(
        self, limiter: TokenLimiter, shared: SharedTokenLimiter | None, budgets: Budgets
    ) -> None:
        self.limiter = limiter  # R-PRIN-2: this Edge's counters; bodies arriving always here
        self.shared = shared  # R-SCALE-6: in-flight, rpm and tpm across Edges instead
        self.budgets = budgets  # R-BUD-1: from the meter's view
        self._principals: dict[str, TokenLimits] = {}
        self._queues: dict[str, int] = {}  # principal -> max_queued (R-MGD-13)

    def configure(self, snapshot: EdgeSnapshot) -> dict[str, Counted]:
        """Take the snapshot's policy (live); how the budgeted principals count, for the
        meter's view."""
        self._principals = {
            p.id: TokenLimits(p.max_in_flight, p.rpm, p.tpm)
            for p in snapshot.principals.values()
            if p.limited
        }
        self._queues = {
            p.id: p.max_queued for p in snapshot.principals.values() if p.max_queued is not None
        }
        keep = [t.token_ref for t in snapshot.principal_tokens]
        self.limiter.retain(keep + [principal_key(ref) for ref in self._principals])
        return self.budgets.limits_of(snapshot)

    def arrive(self, caller: Caller) -> Arrival:
        """Headers authenticated: refuse early (budget spent, too many bodies arriving) or
        count the request from now on. Never admits."""
        budget = self.budgets.admit(caller.principal_ref)  # may refuse early; decided later
        key = caller.token_ref if caller.token_ref is not None else LEGACY_KEY
        try:
            local = self.limiter.arrive(key, caller.max_pending_bodies)  # R-LIM-2
        except RateLimited as exc:
            raise HttpError("rate_limited", str(exc), headers=exc.headers()) from None
        counted = [_Counted("token", key, caller.limits, local, self._slot(key, caller.limits))]
        ref = caller.principal_ref
        limits = self._principals.get(ref) if ref is not None else None
        if ref is not None and limits is not None:  # R-MGD-13: all its keys together
            pkey = principal_key(ref)
            local = self.limiter.arrive(pkey, None)
            counted.append(_Counted("principal", pkey, limits, local, self._slot(pkey, limits)))
        return Arrival(counted, budget or [])

    def _slot(self, key: str, limits: TokenLimits | None) -> SharedTicket | None:
        if limits is None or self.shared is None or not key:
            return None
        return self.shared.arrive(key)  # R-LIM-1 across Edges

    async def decide(self, caller: Caller, arrival: Arrival, estimate: int) -> Headers:
        """The body is read: the one decision. Returns the headers every answer carries
        (``x-budget-*``, ``x-ratelimit-*`` of the token), or raises the refusal."""
        headers: Headers = []
        out: Headers = []
        who = "token"
        try:
            await self.budgets.ready(caller.principal_ref)  # a budget added live: read first
            headers = self.budgets.admit(caller.principal_ref) or []  # R-BUD-1, at admission
            for counted in arrival.counted:
                who, quota = counted.who, None
                if counted.shared is None or self.shared is None:  # no await: the common case
                    self.limiter.decide(counted.local, counted.limits, estimate)
                    quota = counted.local.quota
                else:
                    quota = await self._shared(counted, estimate)
                if quota is not None and who == "token":
                    out = quota.headers()
        except HttpError:
            self.finish(arrival, 0)
            raise
        except RateLimited as exc:
            self.finish(arrival, 0)  # at once: requests deciding together count it no more
            refused = (exc.headers() if who == "token" else exc.headers()[:2]) + headers
            message = f"rate limit reached for this {who} ({exc.limit})"
            raise HttpError("rate_limited", message, headers=refused) from None
        except LimitsUnavailable:
            self.finish(arrival, 0)
            raise HttpError("pool_unavailable", headers=headers) from None
        return headers + out

    async def _shared(self, counted: _Counted, estimate: int) -> Quota | None:
        assert self.shared is not None and counted.shared is not None and counted.limits
        self.limiter.decide(counted.local, None, 0)  # only its body is done
        ticket = await self.shared.admit(counted.key, counted.limits, estimate, counted.shared)
        return ticket.quota

    def queue_share(self, caller: Caller) -> tuple[str | None, int | None]:
        """(owner, max_queued) of the request's share of the one queue (R-PRIN-3): the
        principal's when its entry sets ``max_queued`` (R-MGD-13), else the token's."""
        ref = caller.principal_ref
        shared = self._queues.get(ref) if ref is not None else None
        if ref is not None and shared is not None:
            return principal_key(ref), shared
        return caller.token_ref if caller.max_queued is not None else None, caller.max_queued

    def finish(self, arrival: Arrival, spent: int) -> None:
        """The request ended: its counts come back, its charge settled to ``spent``."""
        for counted in arrival.counted:
            self.limiter.finish(counted.local, spent)
            if counted.shared is not None and self.shared is not None:
                self.shared.finish(counted.shared, spent)
