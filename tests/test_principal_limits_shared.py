"""Per-token limits shared by several Edges through Redis (R-SCALE-6): three limiters in one
process as three Edges on one real Redis (``IOP_TEST_REDIS_URL``) and one key prefix. Redis
time is pinned through the limiter's override where a test moves it; no sleeps."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from pool.http.limits import IN_FLIGHT_RETRY_S, LimitsUnavailable, RateLimited, TokenLimits
from pool.http.limits_shared import SharedTokenLimiter
from tests.support.processes import free_port
from tests.support.redis_pool import REDIS_URL, drop_keys, needs_redis, new_prefix

pytestmark = needs_redis

T0 = 1_800_000_000_000  # a Redis time in ms, on a window edge of 60 s


class Edges:
    def __init__(self, limiters: list[SharedTokenLimiter]) -> None:
        self.all = limiters

    def at(self, ms: int) -> None:
        for lim in self.all:
            lim.time_override = str(ms)

    async def settled(self) -> None:
        for lim in self.all:
            await lim.flush()


@pytest.fixture
async def edges() -> AsyncIterator[Edges]:
    prefix = new_prefix()
    limiters = [SharedTokenLimiter(REDIS_URL, prefix=prefix, ttl_s=2.0) for _ in range(3)]
    for lim in limiters:
        await lim.start()
    running = Edges(limiters)
    running.at(T0)
    try:
        yield running
    finally:
        for lim in limiters:
            await lim.aclose()
        drop_keys(REDIS_URL, prefix)


async def test_rpm_holds_exactly_across_three_edges_under_concurrent_requests(edges):
    """R-SCALE-6: rpm=10 with 30 requests at once spread over three Edges: exactly 10 pass."""
    limits = TokenLimits(rpm=10)
    calls = [edges.all[i % 3].admit("t", limits, 1) for i in range(30)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    passed = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, RateLimited)]
    assert len(passed) == 10 and len(refused) == 20
    assert {r.limit for r in refused} == {"rpm"}
    remaining = sorted(t.quota.remaining_requests for t in passed if t.quota)
    assert remaining == list(range(10))  # each admission saw the global count
    edges.at(T0 + 60_000)  # the next window starts empty on every Edge
    assert (await edges.all[2].admit("t", limits, 1)).quota.remaining_requests == 9


async def test_max_in_flight_holds_across_edges_and_a_finished_slot_is_free_again(edges):
    """R-SCALE-6: max_in_flight=2 counts slots of every Edge; a finish gives one back."""
    limits = TokenLimits(max_in_flight=2)
    first = await edges.all[0].admit("t", limits, 1)
    await edges.all[1].admit("t", limits, 1)
    with pytest.raises(RateLimited) as refused:
        await edges.all[2].admit("t", limits, 1)
    assert refused.value.limit == "max_in_flight"
    assert refused.value.retry_after_s == IN_FLIGHT_RETRY_S
    assert edges.all[0].finish(first, 5) and not edges.all[0].finish(first, 5)  # exactly once
    await edges.settled()
    await edges.all[2].admit("t", limits, 1)


async def test_a_callers_next_request_right_after_its_last_finds_the_slot_free(edges):
    """max_in_flight=1, one request after the other on one Edge: the ended request's settle
    is still queued (it waits up to 50 ms to ride along) when the next admission comes; it
    goes first, in the same round trip, so the caller is never refused by its own past."""
    limits = TokenLimits(max_in_flight=1)
    lim = edges.all[0]
    for _ in range(5):
        ticket = await lim.admit("t", limits, 1)
        assert lim.finish(ticket)
    await edges.settled()
    assert lim.in_flight("t") == 0


async def test_a_dead_edges_in_flight_slots_come_back_one_ttl_after_its_last_renewal(edges):
    """R-SCALE-6: an Edge that dies holding slots (never finishes, never renews) frees them
    once their TTL (2 s here) has passed since its last renewal; live Edges renew theirs."""
    limits = TokenLimits(max_in_flight=2)
    dead, live, other = edges.all
    await dead.admit("t", limits, 1)
    await live.admit("t", limits, 1)
    dead._held.clear()  # it stopped renewing: a crashed process
    edges.at(T0 + 1_500)
    await live.renew()  # the live Edge's slot now expires at T0 + 3.5 s
    edges.at(T0 + 1_999)
    with pytest.raises(RateLimited):
        await other.admit("t", limits, 1)
    edges.at(T0 + 2_000)  # the dead Edge's slot expired; the live one's holds
    await other.admit("t", limits, 1)
    with pytest.raises(RateLimited):
        await other.admit("t", limits, 1)


async def test_tpm_reserves_the_estimate_and_settles_to_the_real_usage(edges):
    """R-SCALE-6: tpm counts prompt plus completion: reserved by estimate at admission,
    replaced by the real usage at the end; an overrun after the window passed goes to the
    current one."""
    limits = TokenLimits(tpm=100)
    a, b, c = edges.all
    ticket = await a.admit("t", limits, 60)
    with pytest.raises(RateLimited) as refused:
        await b.admit("t", limits, 50)  # 60 reserved + 50 > 100
    assert refused.value.limit == "tpm" and refused.value.quota.remaining_tokens == 40
    a.finish(ticket, 20)  # it used 20 in all: 80 come back
    await edges.settled()
    assert (await b.admit("t", limits, 50)).quota.remaining_tokens == 30
    late = await c.admit("t", limits, 10)
    edges.at(T0 + 61_000)
    c.finish(late, 40)  # 30 more than reserved, charged to the new window
    await edges.settled()
    assert (await a.admit("t", limits, 10)).quota.remaining_tokens == 60


async def test_a_big_prompt_runs_alone_in_a_fresh_window(edges):
    """R-SCALE-6 keeps R-PRIN-2's rule: a request over the whole tpm is slowed, not locked out."""
    limits = TokenLimits(tpm=100)
    await edges.all[0].admit("t", limits, 500)
    with pytest.raises(RateLimited):
        await edges.all[1].admit("t", limits, 1)


async def test_tokens_are_counted_apart(edges):
    """R-SCALE-6: one token's limit never refuses another token."""
    limits = TokenLimits(rpm=1)
    await edges.all[0].admit("a", limits, 1)
    await edges.all[1].admit("b", limits, 1)
    with pytest.raises(RateLimited):
        await edges.all[2].admit("a", limits, 1)


async def test_redis_away_at_admission_is_limits_unavailable():
    """R-SCALE-6: no answer from Redis refuses the request (503 pool_unavailable), never
    admits it uncounted."""
    lim = SharedTokenLimiter(f"redis://127.0.0.1:{free_port()}/0", prefix=new_prefix())
    await lim.start()
    try:
        with pytest.raises(LimitsUnavailable):
            await lim.admit("t", TokenLimits(rpm=1), 1)
    finally:
        await lim.aclose()


async def test_a_request_cancelled_while_being_admitted_gives_its_slot_back(edges):
    """R-SCALE-6: a client that leaves while its admission is on the way to Redis holds no
    slot afterwards: an admitted charge is settled back (its tokens too). The cancel lands at
    every point from before the command is sent to after its answer arrived; alone (one
    EVALSHA) and behind another admission (the writer's pipeline)."""
    limits = TokenLimits(max_in_flight=1, tpm=100)
    a, b, _ = edges.all
    for crowded in (False, True):
        for yields in range(12):
            token = f"t-{crowded}-{yields}"
            other = asyncio.ensure_future(a.admit(f"{token}-other", limits, 1)) if crowded else None
            task = asyncio.ensure_future(a.admit(token, limits, 70))
            for _ in range(yields):
                await asyncio.sleep(0)
            task.cancel()
            try:
                done = await task
            except asyncio.CancelledError:
                pass
            else:  # admitted before the cancel: the request ends as any other
                a.finish(done, 0)
            if other is not None:
                await other
            admitted = []
            for _ in range(200):  # bounded: each try is one round trip
                await a.flush()
                with contextlib.suppress(RateLimited):
                    admitted.append(await b.admit(token, limits, 70))
                if admitted:
                    break
            assert admitted, f"slot lost: cancel after {yields} yields, crowded {crowded}"
            assert admitted[0].quota is not None and admitted[0].quota.remaining_tokens == 30


async def test_live_slots_count_again_after_redis_lost_them(edges):
    """R-SCALE-6: a Redis restarted empty forgets every slot; the next renewal (every TTL/3)
    puts the live ones back, while a slot ended meanwhile stays gone."""
    limits = TokenLimits(max_in_flight=1)
    a, b, _ = edges.all
    await a.admit("t", limits, 1)
    ended = await a.admit("u", limits, 1)
    drop_keys(REDIS_URL, a.prefix)
    a.finish(ended)
    await a.renew()
    with pytest.raises(RateLimited):
        await b.admit("t", limits, 1)
    await b.admit("u", limits, 1)
