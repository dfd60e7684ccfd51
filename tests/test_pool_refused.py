"""Providers a Node refuses (its own policy, R-TLS-3) are never candidates, and say why."""

from __future__ import annotations

import asyncio

import pytest

from pool.engine import PoolPolicy, PoolProvider, ProviderPool
from pool.engine.errors import Unavailable

POLICY = PoolPolicy(
    (
        PoolProvider("n1", "p-ok", 1, 0, 10, True, frozenset({"chat"})),
        PoolProvider("n1", "p-denied", 4, 0, 1, True, frozenset({"chat"})),
    ),
    {"m": ("p-ok", "p-denied"), "only-denied": ("p-denied",)},
    max_queue=16,
    queue_timeout_ms=0,
)
WHY = "refused by node policy: upstream https://evil.example:443 is not an allowed host"


def _row(pool: ProviderPool, provider_id: str):  # type: ignore[no-untyped-def]
    return next(r for r in pool.snapshot().providers if r.provider_id == provider_id)


async def test_a_refused_provider_is_never_leased_even_with_the_better_priority_r_tls_3():
    pool = ProviderPool(POLICY)
    pool.node_ready("n1", 1, {"p-denied": WHY})
    lease = await pool.acquire("m")
    assert lease.provider_id == "p-ok"
    second = asyncio.create_task(pool.acquire("m"))  # p-ok is full: it queues, never p-denied
    await asyncio.sleep(0)
    assert pool.snapshot().queue_depth == 1 and _row(pool, "p-denied").in_flight == 0
    pool.release(lease)
    assert (await second).provider_id == "p-ok"


async def test_a_group_with_only_refused_providers_is_unavailable_at_once_r_tls_3():
    pool = ProviderPool(POLICY)
    pool.node_ready("n1", 1, {"p-denied": WHY})
    with pytest.raises(Unavailable):
        await pool.acquire("only-denied")
    assert pool.idle()


def test_the_snapshot_shows_a_refused_provider_offline_with_its_reason_r_tls_3():
    pool = ProviderPool(POLICY)
    pool.node_ready("n1", 1, {"p-denied": WHY})
    assert (_row(pool, "p-denied").online, _row(pool, "p-denied").unavailable) == (False, WHY)
    assert (_row(pool, "p-ok").online, _row(pool, "p-ok").unavailable) == (True, None)


async def test_a_refresh_ack_can_refuse_or_free_a_provider_of_the_ready_node_r_tls_3():
    pool = ProviderPool(POLICY)
    pool.node_ready("n1", 1)
    assert _row(pool, "p-denied").online
    pool.node_refused("n1", 1, {"p-denied": WHY})
    assert _row(pool, "p-denied").unavailable == WHY
    pool.node_refused("n1", 0, {})  # a stale generation changes nothing
    assert _row(pool, "p-denied").unavailable == WHY
    pool.node_refused("n1", 1, {})
    assert (await pool.acquire("only-denied")).provider_id == "p-denied"


def test_a_new_connection_starts_from_what_that_connection_reported():
    pool = ProviderPool(POLICY)
    pool.node_ready("n1", 1, {"p-denied": WHY})
    pool.node_gone("n1", 1)
    assert _row(pool, "p-denied").unavailable is None  # offline, no stale reason
    pool.node_ready("n1", 2)
    assert _row(pool, "p-denied").online
