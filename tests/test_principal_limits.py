"""The per-token limiter on a fake clock: in-flight, requests and tokens per window (R-PRIN-2).

No sleeps: the clock is a number the test moves.
"""

from __future__ import annotations

import pytest

from pool.http.limits import (
    IN_FLIGHT_RETRY_S,
    RateLimited,
    Ticket,
    TokenLimiter,
    TokenLimits,
    format_duration,
)
from tests.support.clock import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock(1000.0)


def limiter(clock: Clock, window_s: float = 60.0) -> TokenLimiter:
    return TokenLimiter(window_s, clock)


def test_a_burst_of_exactly_rpm_requests_passes_and_the_next_is_refused(clock: Clock) -> None:
    """R-PRIN-2: rpm=5 admits five requests in a window, the sixth is rate limited."""
    lim = limiter(clock)
    limits = TokenLimits(rpm=5)
    tickets = [lim.admit("t", limits, 1) for _ in range(5)]
    assert [t.quota.remaining_requests for t in tickets if t.quota] == [4, 3, 2, 1, 0]
    with pytest.raises(RateLimited) as refused:
        lim.admit("t", limits, 1)
    assert refused.value.limit == "rpm"
    assert refused.value.quota is not None and refused.value.quota.remaining_requests == 0


def test_the_window_resets_exactly_at_the_minute_edge(clock: Clock) -> None:
    """R-PRIN-2: the last instant of a window still counts there; the edge starts a new one."""
    clock.now = 1019.999  # window 16 covers [960, 1020)
    lim = limiter(clock)
    limits = TokenLimits(rpm=2)
    lim.admit("t", limits, 1)
    lim.admit("t", limits, 1)
    with pytest.raises(RateLimited) as refused:
        lim.admit("t", limits, 1)
    assert refused.value.retry_after_s == pytest.approx(0.001)
    clock.now = 1020.0
    fresh = lim.admit("t", limits, 1)
    assert fresh.quota is not None
    assert fresh.quota.remaining_requests == 1
    assert fresh.quota.reset_s == pytest.approx(60.0)


def test_retry_after_is_the_time_to_the_next_window_in_whole_and_milli_seconds(
    clock: Clock,
) -> None:
    """R-PRIN-2: Retry-After is the time to the next window, in seconds and in ms."""
    clock.now = 1000.25  # 19.75 s before the edge at 1020
    lim = limiter(clock)
    lim.admit("t", TokenLimits(rpm=1), 1)
    with pytest.raises(RateLimited) as refused:
        lim.admit("t", TokenLimits(rpm=1), 1)
    headers = dict(refused.value.headers())
    assert headers[b"retry-after"] == b"20"
    assert headers[b"retry-after-ms"] == b"19750"
    assert headers[b"x-ratelimit-limit-requests"] == b"1"
    assert headers[b"x-ratelimit-remaining-requests"] == b"0"
    assert headers[b"x-ratelimit-reset-requests"] == b"19.75s"
    assert b"x-ratelimit-limit-tokens" not in headers


def test_tokens_per_window_count_the_input_estimate_up_to_the_limit_exactly(
    clock: Clock,
) -> None:
    """R-PRIN-2: tokens per window count the input estimate up to the limit exactly."""
    lim = limiter(clock)
    limits = TokenLimits(tpm=100)
    lim.admit("t", limits, 60)
    last = lim.admit("t", limits, 40)  # exactly at the limit
    assert last.quota is not None and last.quota.remaining_tokens == 0
    with pytest.raises(RateLimited) as refused:
        lim.admit("t", limits, 1)
    assert refused.value.limit == "tpm"
    headers = dict(refused.value.headers())
    assert headers[b"x-ratelimit-limit-tokens"] == b"100"
    assert headers[b"x-ratelimit-remaining-tokens"] == b"0"


def test_real_usage_replaces_the_estimate_when_the_run_ends(clock: Clock) -> None:
    """R-PRIN-2: the estimate is corrected by the tokens actually used, both ways."""
    lim = limiter(clock)
    limits = TokenLimits(tpm=100)
    over = lim.admit("t", limits, 10)
    lim.finish(over, 70)  # used more than estimated
    assert lim.used("t") == (1, 70)
    under = lim.admit("t", limits, 30)
    lim.finish(under, 5)  # used less: the difference comes back
    assert lim.used("t") == (2, 75)
    lim.admit("t", limits, 25)  # 75 + 25 = 100: exactly fits again
    with pytest.raises(RateLimited):
        lim.admit("t", limits, 1)


def test_usage_reported_after_the_window_passed_charges_only_the_excess(clock: Clock) -> None:
    """R-PRIN-2: usage reported after the window passed charges only the excess."""
    clock.now = 1010.0
    lim = limiter(clock)
    limits = TokenLimits(tpm=100)
    early = lim.admit("t", limits, 50)
    cheap = lim.admit("t", limits, 40)
    clock.now = 1030.0  # the next window
    lim.finish(early, 80)  # 30 over its estimate: charged now
    lim.finish(cheap, 10)  # under its estimate: the old window is gone, nothing to refund
    assert lim.used("t") == (0, 30)


def test_a_request_larger_than_the_whole_budget_runs_alone_in_a_fresh_window(
    clock: Clock,
) -> None:
    """R-PRIN-2: a request larger than the whole budget runs alone in a fresh window."""
    lim = limiter(clock)
    limits = TokenLimits(tpm=100)
    big = lim.admit("t", limits, 500)
    with pytest.raises(RateLimited):
        lim.admit("t", limits, 1)
    lim.finish(big, 500)
    clock.now += 60
    lim.admit("t", limits, 500)


def test_max_in_flight_refuses_until_a_request_ends(clock: Clock) -> None:
    """R-PRIN-2: max in flight refuses until a request ends."""
    lim = limiter(clock)
    limits = TokenLimits(max_in_flight=2)
    first = lim.admit("t", limits, 1)
    lim.admit("t", limits, 1)
    with pytest.raises(RateLimited) as refused:
        lim.admit("t", limits, 1)
    assert refused.value.limit == "max_in_flight"
    assert refused.value.retry_after_s == IN_FLIGHT_RETRY_S
    lim.finish(first, 1)
    lim.admit("t", limits, 1)
    assert lim.in_flight("t") == 2


def test_a_token_whose_requests_are_all_cancelled_returns_to_zero_in_flight(
    clock: Clock,
) -> None:
    """R-POOL-9 for the limiter: every ticket is settled once, a second finish is a no-op."""
    lim = limiter(clock)
    limits = TokenLimits(max_in_flight=3, tpm=1000)
    tickets = [lim.admit("t", limits, 10) for _ in range(3)]
    for ticket in tickets:  # cancelled before any output: no usage but the estimate
        assert lim.finish(ticket, 0) is True
        assert lim.finish(ticket, 0) is False
    assert lim.in_flight("t") == 0
    assert lim.used("t") == (3, 0)
    assert all(isinstance(t, Ticket) and t.done for t in tickets)


def test_tokens_are_counted_apart(clock: Clock) -> None:
    """R-PRIN-2: tokens are counted apart."""
    lim = limiter(clock)
    limits = TokenLimits(rpm=1)
    lim.admit("a", limits, 1)
    lim.admit("b", limits, 1)
    with pytest.raises(RateLimited):
        lim.admit("a", limits, 1)


def test_a_lowered_limit_applies_to_the_next_admission_and_cancels_nothing(
    clock: Clock,
) -> None:
    """Limits are read per request (live); running requests keep their slot."""
    lim = limiter(clock)
    running = [lim.admit("t", TokenLimits(max_in_flight=4), 1) for _ in range(3)]
    with pytest.raises(RateLimited):
        lim.admit("t", TokenLimits(max_in_flight=1), 1)
    assert lim.in_flight("t") == 3
    for ticket in running:
        lim.finish(ticket, 1)
    lim.admit("t", TokenLimits(max_in_flight=1), 1)


def test_a_revoked_token_is_forgotten_once_idle(clock: Clock) -> None:
    """R-PRIN-2: a revoked token is forgotten once idle."""
    lim = limiter(clock)
    busy = lim.admit("gone", TokenLimits(rpm=10), 1)
    lim.admit("kept", TokenLimits(rpm=10), 1)
    lim.retain(["kept"])
    assert len(lim) == 2  # still running: kept until it ends
    lim.finish(busy, 1)
    lim.retain(["kept"])
    assert len(lim) == 1 and lim.in_flight("gone") == 0


def test_a_short_window_keeps_its_own_edges(clock: Clock) -> None:
    """R-PRIN-2: a short window keeps its own edges."""
    clock.now = 10.4
    lim = limiter(clock, window_s=0.5)  # windows [10.0, 10.5), [10.5, 11.0)
    lim.admit("t", TokenLimits(rpm=1), 1)
    with pytest.raises(RateLimited) as refused:
        lim.admit("t", TokenLimits(rpm=1), 1)
    assert refused.value.retry_after_s == pytest.approx(0.1)
    clock.now = 10.5
    lim.admit("t", TokenLimits(rpm=1), 1)


def test_reset_durations_read_like_openai_headers() -> None:
    """R-PRIN-2: reset durations read like openai headers."""
    assert format_duration(59.0) == b"59s"
    assert format_duration(1.5) == b"1.5s"
    assert format_duration(0.02) == b"0.02s"
    assert format_duration(-1.0) == b"0s"
