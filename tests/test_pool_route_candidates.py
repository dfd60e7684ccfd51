"""A managed route's candidate filter in the pool (R-MGD-3): ``acquire(..., only=...)``
leases only the named providers and waits for them rather than taking another."""

from __future__ import annotations

import asyncio

import pytest

from pool.engine import NotAdmitted
from tests.support.pools import prov, ready_pool


async def test_only_the_routes_providers_are_leased_r_mgd_3() -> None:
    pool = ready_pool(prov("a"), prov("b"))
    first = await pool.acquire("m", only=frozenset({"b"}))
    assert first.provider_id == "b"
    pool.release(first)
    second = await pool.acquire("m", only=frozenset({"b"}))  # round robin would pick "a"
    assert second.provider_id == "b"
    pool.release(second)
    assert pool.idle()


async def test_a_route_request_waits_for_its_provider_while_another_is_free_r_mgd_3() -> None:
    """The busy route provider is waited for; the free one outside the route stays free, and
    an unfiltered request still takes it."""
    pool = ready_pool(prov("a"), prov("b"))
    held = await pool.acquire("m", only=frozenset({"b"}))
    waiter = asyncio.create_task(pool.acquire("m", only=frozenset({"b"})))
    for _ in range(100):
        if pool.snapshot().queue_depth == 1:
            break
        await asyncio.sleep(0)
    assert pool.snapshot().queue_depth == 1
    other = await pool.acquire("m")
    assert other.provider_id == "a"
    pool.release(held)
    granted = await asyncio.wait_for(waiter, 5)
    assert granted.provider_id == "b"
    pool.release(granted)
    pool.release(other)
    assert pool.idle()


async def test_a_route_naming_no_provider_of_the_group_is_not_admitted_r_mgd_3() -> None:
    pool = ready_pool(prov("a"))
    with pytest.raises(NotAdmitted):
        await pool.acquire("m", only=frozenset({"elsewhere"}))
    assert pool.idle()
