"""Per-token limits: bodies still arriving, in-flight, requests and tokens per window.

R-PRIN-2, R-LIM-1, R-LIM-2. Plain Python with an injectable clock, no Django and no I/O. The
surface calls ``arrive`` once the headers are authenticated (the request counts in flight
from then on, and as a pending body until ``decide``), ``decide`` once the body is read (the
one admission decision, on counts that include the other requests still sending their
bodies) and ``finish`` exactly once when the request ends, however it ends
(``docs/http-api.md``, "Per-token limits"). ``admit`` is ``arrive`` and ``decide`` at once.

Windows are fixed: window ``k`` covers ``[k * window_s, (k + 1) * window_s)`` on the clock, so
every token's counters roll over at the same instants and ``reset`` is the time to the next
edge. ``rpm`` and ``tpm`` count per window (60 s unless the Edge is told otherwise).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

IN_FLIGHT_RETRY_S = 1.0  # over max_in_flight: no reset time is known, a run ends soon enough
# R-LIM-2: requests of one token whose body is still arriving, on one Edge, unless the token
# says otherwise (docs/http-api.md, "Per-token limits").
DEFAULT_MAX_PENDING_BODIES = 8


@dataclass(frozen=True, slots=True)
class TokenLimits:
    """A token's limits; None = unlimited. Read from the snapshot per request, so live."""

    max_in_flight: int | None = None
    rpm: int | None = None
    tpm: int | None = None

    @property
    def any(self) -> bool:
        return self.max_in_flight is not None or self.rpm is not None or self.tpm is not None


@dataclass(slots=True)  # not frozen: built per request, and frozen __init__ costs more
class Quota:
    """What the ``x-ratelimit-*`` headers report: limits, what is left, time to the reset."""

    limit_requests: int | None
    remaining_requests: int
    limit_tokens: int | None
    remaining_tokens: int
    reset_s: float

    def headers(self) -> list[tuple[bytes, bytes]]:
        """The headers OpenAI clients read; only for the limits the token has."""
        reset = format_duration(self.reset_s)
        out: list[tuple[bytes, bytes]] = []
        if self.limit_requests is not None:
            out += [
                (b"x-ratelimit-limit-requests", b"%d" % self.limit_requests),
                (b"x-ratelimit-remaining-requests", b"%d" % self.remaining_requests),
                (b"x-ratelimit-reset-requests", reset),
            ]
        if self.limit_tokens is not None:
            out += [
                (b"x-ratelimit-limit-tokens", b"%d" % self.limit_tokens),
                (b"x-ratelimit-remaining-tokens", b"%d" % self.remaining_tokens),
                (b"x-ratelimit-reset-tokens", reset),
            ]
        return out


class LimitsUnavailable(Exception):
    """The shared counters (scale-out, ``limits_shared``) did not answer: the request gets
    503 ``pool_unavailable``, never admitted uncounted (R-SCALE-6)."""


class RateLimited(Exception):
    """Over a limit: retry after ``retry_after_s``; ``quota`` for the headers (may be None)."""

    def __init__(self, limit: str, retry_after_s: float, quota: Quota | None) -> None:
        super().__init__(f"rate limit reached for this token ({limit})")
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.quota = quota

    def headers(self) -> list[tuple[bytes, bytes]]:
        """``Retry-After`` (whole seconds, at least 1), ``retry-after-ms`` and the quota."""
        wait = max(self.retry_after_s, 0.001)
        out = [
            (b"retry-after", str(max(1, math.ceil(wait))).encode()),
            (b"retry-after-ms", str(max(1, math.ceil(wait * 1000))).encode()),
        ]
        if self.quota is not None:
            out += self.quota.headers()
        return out


def format_duration(seconds: float) -> bytes:
    """``1.5s``, ``59s``, ``0.02s``: the reset as OpenAI clients print it."""
    return (b"%.3f" % max(seconds, 0.0)).rstrip(b"0").rstrip(b".") + b"s"


class _Counter:
    __slots__ = ("in_flight", "pending", "requests", "tokens", "window")

    def __init__(self, window: int) -> None:
        self.in_flight = 0  # from the headers to the end: pending bodies included (R-LIM-1)
        self.pending = 0  # bodies still arriving (R-LIM-2)
        self.window = window
        self.requests = 0
        self.tokens = 0


class Ticket:
    """One request's place in the counters from its headers on, and its charge once
    admitted; ``TokenLimiter.finish`` takes both back exactly once."""

    __slots__ = ("admitted", "done", "estimate", "pending", "quota", "token_ref", "window")

    def __init__(self, token_ref: str, window: int, estimate: int, quota: Quota | None) -> None:
        self.token_ref = token_ref
        self.window = window
        self.estimate = estimate
        self.quota = quota
        self.done = False
        self.pending = False  # counted as a body still arriving
        self.admitted = True  # charged to rpm and tpm (False from ``arrive`` to ``decide``)


class TokenLimiter:
    """In-memory counters keyed by token ref; every method is synchronous (one event loop)."""

    def __init__(self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.window_s = window_s
        self._clock = clock
        self._counters: dict[str, _Counter] = {}

    def admit(self, token_ref: str, limits: TokenLimits, estimate: int) -> Ticket:
        """``arrive`` and ``decide`` at once (a request whose body is already read)."""
        ticket = self.arrive(token_ref, None)
        try:
            self.decide(ticket, limits, estimate)
        except RateLimited:
            self.finish(ticket)
            raise
        return ticket

    def arrive(self, token_ref: str, max_pending: int | None) -> Ticket:
        """The headers are authenticated: the request counts in flight and as a pending body
        (R-LIM-1), or ``RateLimited`` when the token already holds ``max_pending`` bodies
        still arriving (R-LIM-2). Admits nothing: ``decide`` does, after the body."""
        counter = self._counters.get(token_ref)
        if counter is None:
            counter = self._counters[token_ref] = _Counter(-1)
        if max_pending is not None and counter.pending >= max_pending:
            raise RateLimited("max_pending_bodies", IN_FLIGHT_RETRY_S, None)
        counter.pending += 1
        counter.in_flight += 1
        ticket = Ticket(token_ref, -1, 0, None)
        ticket.pending, ticket.admitted = True, False
        return ticket

    def decide(self, ticket: Ticket, limits: TokenLimits | None, estimate: int) -> None:
        """The body is read: the one admission decision (R-LIM-1) on the counts now, which
        include the token's other requests still sending bodies; ``RateLimited`` refuses
        (``finish`` still gives the ticket back). ``limits`` None: only the body is done."""
        counter = self._counters[ticket.token_ref]
        if ticket.pending:
            ticket.pending = False
            counter.pending -= 1
        if limits is None:
            return
        now = self._clock()
        window = math.floor(now / self.window_s)
        if counter.window != window:
            counter.window, counter.requests, counter.tokens = window, 0, 0
        reset_s = (window + 1) * self.window_s - now
        others = counter.in_flight - 1  # this request counts from its headers on
        if limits.max_in_flight is not None and others >= limits.max_in_flight:
            raise RateLimited(
                "max_in_flight", IN_FLIGHT_RETRY_S, self._quota(counter, limits, reset_s)
            )
        if limits.rpm is not None and counter.requests >= limits.rpm:
            raise RateLimited("rpm", reset_s, self._quota(counter, limits, reset_s))
        # A request larger than the whole budget still runs alone in a fresh window, so a
        # big prompt is slowed down, never locked out.
        if limits.tpm is not None and counter.tokens and counter.tokens + estimate > limits.tpm:
            raise RateLimited("tpm", reset_s, self._quota(counter, limits, reset_s))
        counter.requests += 1
        counter.tokens += estimate
        ticket.window, ticket.estimate, ticket.admitted = window, estimate, True
        ticket.quota = self._quota(counter, limits, reset_s) if limits.rpm or limits.tpm else None

    def finish(self, ticket: Ticket, used_tokens: int | None = None) -> bool:
        """The request ended: its in-flight slot comes back and the estimate is corrected.

        ``used_tokens`` (input + output, reported or estimated) replaces the estimate while
        the admission's window is current; after it has passed, only an excess over the
        estimate is charged to the current window; a request never admitted is charged
        nothing. False when already finished.
        """
        if ticket.done:
            return False
        ticket.done = True
        counter = self._counters.get(ticket.token_ref)
        if counter is None:
            return True
        counter.in_flight -= 1
        if ticket.pending:
            ticket.pending = False
            counter.pending -= 1
        if used_tokens is not None and ticket.admitted:
            correction = used_tokens - ticket.estimate
            window = math.floor(self._clock() / self.window_s)
            if counter.window == ticket.window == window:
                counter.tokens = max(0, counter.tokens + correction)
            elif correction > 0:
                if counter.window != window:
                    counter.window, counter.requests, counter.tokens = window, 0, 0
                counter.tokens += correction
        return True

    def in_flight(self, token_ref: str) -> int:
        counter = self._counters.get(token_ref)
        return counter.in_flight if counter is not None else 0

    def pending(self, token_ref: str) -> int:
        counter = self._counters.get(token_ref)
        return counter.pending if counter is not None else 0

    def used(self, token_ref: str) -> tuple[int, int]:
        """(requests, tokens) counted in the current window."""
        counter = self._counters.get(token_ref)
        window = math.floor(self._clock() / self.window_s)
        if counter is None or counter.window != window:
            return (0, 0)
        return (counter.requests, counter.tokens)

    def retain(self, token_refs: Iterable[str]) -> None:
        """Forget idle counters of tokens no longer configured (a revoked token)."""
        keep = set(token_refs)
        for ref in [r for r, c in self._counters.items() if r not in keep and not c.in_flight]:
            del self._counters[ref]

    def __len__(self) -> int:
        return len(self._counters)

    @staticmethod
    def _quota(counter: _Counter, limits: TokenLimits, reset_s: float) -> Quota:
        return Quota(
            limit_requests=limits.rpm,
            remaining_requests=max(0, (limits.rpm or 0) - counter.requests),
            limit_tokens=limits.tpm,
            remaining_tokens=max(0, (limits.tpm or 0) - counter.tokens),
            reset_s=reset_s,
        )
