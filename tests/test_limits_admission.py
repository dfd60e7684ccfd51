"""One admission decision on counts that include bodies still arriving (R-LIM-1, R-LIM-2):
the in-memory limiter on a fake clock, and the limiter shared in Redis as two Edges of one
process (``IOP_TEST_REDIS_URL``). The end-to-end cases are tests/test_limits_adversary_e2e.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from catalog.config import load_snapshot
from pool.http.admission import Admission, principal_key
from pool.http.auth import Caller
from pool.http.budgets import Budgets
from pool.http.errors import HttpError
from pool.http.limits import RateLimited, TokenLimiter, TokenLimits
from pool.http.limits_shared import SharedTokenLimiter
from pool.metering.budget_view import BudgetView
from tests.support.clock import Clock
from tests.support.config_examples import example_document
from tests.support.redis_pool import REDIS_URL, drop_keys, needs_redis, new_prefix


def test_a_body_still_arriving_counts_in_flight_and_is_charged_only_once_admitted() -> None:
    """R-LIM-1: ``arrive`` counts the request in flight and pending; the token's other
    request, decided while that body still arrives, is refused over ``max_in_flight: 1``
    and its count given back at once; the arrived one is decided and charged after."""
    lim = TokenLimiter(60.0, Clock(1000.0))
    limits = TokenLimits(max_in_flight=1, tpm=100)
    slow = lim.arrive("t", 8)
    assert (lim.in_flight("t"), lim.pending("t")) == (1, 1)
    with pytest.raises(RateLimited) as refused:
        lim.admit("t", limits, 10)
    assert refused.value.limit == "max_in_flight"
    assert (lim.in_flight("t"), lim.pending("t"), lim.used("t")) == (1, 1, (0, 0))
    lim.decide(slow, limits, 10)
    assert (lim.pending("t"), lim.used("t")) == (0, (1, 10))
    assert lim.finish(slow, 30) and not lim.finish(slow, 30)
    assert (lim.in_flight("t"), lim.used("t")) == (0, (1, 30))


def test_a_request_refused_before_admission_is_charged_nothing() -> None:
    """R-LIM-1: a request whose body never came (or that was refused) gives back its
    in-flight and pending counts and is charged no request and no token."""
    lim = TokenLimiter(60.0, Clock(1000.0))
    gone = lim.arrive("t", 8)
    assert lim.finish(gone, 500)
    assert (lim.in_flight("t"), lim.pending("t"), lim.used("t")) == (0, 0, (0, 0))


def test_the_token_s_next_pending_body_over_its_bound_is_refused_at_arrival() -> None:
    """R-LIM-2: ``max_pending_bodies`` bodies arriving at once; the next is refused with
    Retry-After 1 s, another token is not; a decided one makes room."""
    lim = TokenLimiter(60.0, Clock(1000.0))
    held = [lim.arrive("t", 2) for _ in range(2)]
    with pytest.raises(RateLimited) as refused:
        lim.arrive("t", 2)
    assert refused.value.limit == "max_pending_bodies"
    assert dict(refused.value.headers())[b"retry-after"] == b"1"
    lim.arrive("other", 2)
    lim.decide(held[0], None, 0)
    lim.arrive("t", 2)
    assert lim.pending("t") == 2 and lim.in_flight("t") == 3


@pytest.fixture
async def edges() -> AsyncIterator[list[SharedTokenLimiter]]:
    prefix = new_prefix()
    limiters = [SharedTokenLimiter(REDIS_URL, prefix=prefix, ttl_s=2.0) for _ in range(2)]
    for lim in limiters:
        await lim.start()
    try:
        yield limiters
    finally:
        for lim in limiters:
            await lim.aclose()
        drop_keys(REDIS_URL, prefix)


@needs_redis
async def test_a_body_arriving_on_one_edge_counts_in_flight_on_the_other(edges) -> None:
    """R-LIM-1 across Edges: a request whose body still arrives on Edge A holds its slot in
    Redis: Edge B refuses the token's next request over ``max_in_flight: 1``; A's request,
    decided next, is admitted on its own slot; once it ends B admits again."""
    a, b = edges
    limits = TokenLimits(max_in_flight=1)
    slow = a.arrive("t")
    await a.flush()
    with pytest.raises(RateLimited) as refused:
        await b.admit("t", limits, 1)
    assert refused.value.limit == "max_in_flight"
    ticket = await a.admit("t", limits, 1, slow)
    assert ticket is slow and slow.admitted
    a.finish(slow, 1)
    await a.flush()
    b.finish(await b.admit("t", limits, 1), 1)


@needs_redis
async def test_a_refused_request_s_slot_is_gone_when_its_refusal_returns(edges) -> None:
    """R-LIM-1 across Edges: Edge B's request arrives (its slot on its way to Redis in the
    writer's pipeline) and is decided at once, refused over ``max_in_flight: 1`` by A's held
    body. Its decision never overtakes its own arrival, and a refused slot is never renewed:
    when the refusal returns nothing of it is left, so A's body is admitted."""
    a, b = edges
    limits = TokenLimits(max_in_flight=1)
    slow = a.arrive("t")
    await a.flush()
    sending, go = asyncio.Event(), asyncio.Event()
    pipeline = b._pipeline

    async def held_pipeline(batch: list[Any]) -> list[Any]:
        sending.set()
        await go.wait()
        return await pipeline(batch)

    b._pipeline = held_pipeline  # type: ignore[method-assign]
    mine = b.arrive("t")
    await sending.wait()  # the arrival's slot is being sent
    decided = asyncio.ensure_future(b.admit("t", limits, 1, mine))
    await asyncio.sleep(0)
    go.set()
    with pytest.raises(RateLimited):
        await decided
    await b.renew()  # a renewal after the refusal does not bring its slot back
    assert (await a.admit("t", limits, 1, slow)) is slow
    b.finish(mine)
    a.finish(slow, 1)


@needs_redis
async def test_requests_deciding_together_never_all_refuse_each_other(edges) -> None:
    """R-LIM-1 across Edges: six requests arrive on two Edges (each slot held), then all are
    decided under ``max_in_flight: 2``: a refused one's slot goes at once, so exactly two
    are admitted, whatever the order."""
    limits = TokenLimits(max_in_flight=2)
    arrived = [(edges[i % 2], edges[i % 2].arrive("t")) for i in range(6)]
    for lim in edges:
        await lim.flush()
    admitted = 0
    for lim, ticket in arrived:
        try:
            await lim.admit("t", limits, 1, ticket)
            admitted += 1
        except RateLimited:
            lim.finish(ticket)
    assert admitted == 2


def admission_for(document: dict[str, Any], shared: SharedTokenLimiter | None = None) -> Admission:
    admission = Admission(TokenLimiter(60.0, Clock(1000.0)), shared, Budgets(BudgetView()))
    admission.configure(load_snapshot(document))
    return admission


def principal_document(**policy: Any) -> dict[str, Any]:
    document = example_document()
    document["principals"] = [{"id": "team", **policy}]
    return document


async def test_a_principal_s_limits_count_all_its_keys_together_r_mgd_13() -> None:
    """R-MGD-13: ``rpm: 2`` on the principal: two requests on two of its keys pass, the
    third is refused naming the principal; another principal is not counted."""
    admission = admission_for(principal_document(rpm=2))
    keys = [Caller("team", "a"), Caller("team", "b"), Caller("team", "a")]
    for caller in keys[:2]:
        await admission.decide(caller, admission.arrive(caller), 1)
    with pytest.raises(HttpError) as refused:
        await admission.decide(keys[2], admission.arrive(keys[2]), 1)
    assert refused.value.code == "rate_limited"
    assert refused.value.message == "rate limit reached for this principal (rpm)"
    other = Caller("other", "c")
    await admission.decide(other, admission.arrive(other), 1)


def test_a_principal_s_queue_share_is_the_one_the_pool_counts_r_mgd_13() -> None:
    """R-MGD-13: with ``max_queued`` on the principal every key of it queues as the
    principal; without, a token's own share (R-PRIN-3) stands."""
    admission = admission_for(principal_document(max_queued=3))
    assert admission.queue_share(Caller("team", "a", max_queued=1)) == (principal_key("team"), 3)
    assert admission.queue_share(Caller("other", "b", max_queued=1)) == ("b", 1)
    assert admission.queue_share(Caller("other", "b")) == (None, None)


@needs_redis
async def test_a_principal_s_in_flight_holds_across_edges_from_the_headers_r_mgd_13(
    edges,
) -> None:
    """R-MGD-13, R-LIM-1 across Edges: ``max_in_flight: 1`` on the principal; a request of
    one of its keys arrived on Edge A (body still arriving) makes Edge B refuse a request
    of another of its keys; once A's ends, B admits."""
    document = principal_document(max_in_flight=1)
    a, b = (admission_for(document, shared) for shared in edges)
    first = a.arrive(Caller("team", "x"))
    await edges[0].flush()
    second = Caller("team", "y")
    with pytest.raises(HttpError) as refused:
        await b.decide(second, b.arrive(second), 1)
    assert refused.value.message == "rate limit reached for this principal (max_in_flight)"
    a.finish(first, 0)
    await edges[0].flush()
    again = b.arrive(second)
    await b.decide(second, again, 1)
    b.finish(again, 1)
