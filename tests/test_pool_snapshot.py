"""The pool snapshot: per-provider figures, offline identity, queue depth (R-POOL-8)."""

from __future__ import annotations

import asyncio
import json

from pool.engine import PoolPolicy, PoolProvider, ProviderPool
from tests.support.clock import Clock
from tests.support.pools import enqueue

POLICY = PoolPolicy(
    (
        PoolProvider("n2", "z-remote", 3, 1, 5, True, frozenset({"chat"})),
        PoolProvider("n1", "b-local", 2, 1, 20, True, frozenset({"chat"})),
        PoolProvider("n1", "a-local", 1, 0, 10, False, frozenset({"chat"})),
    ),
    {"m": ("b-local", "z-remote"), "other": ("b-local",)},
    max_queue=16,
    queue_timeout_ms=0,
)


def test_offline_providers_keep_identity_with_zero_figures_r_pool_8() -> None:
    snap = ProviderPool(POLICY).snapshot()
    assert [(r.node_id, r.provider_id) for r in snap.providers] == [
        ("n1", "a-local"),
        ("n1", "b-local"),
        ("n2", "z-remote"),
    ]
    remote = snap.providers[2]
    assert not remote.online and (remote.capacity, remote.priority, remote.enabled) == (3, 5, True)
    assert (remote.in_flight, remote.long_in_flight, remote.queued) == (0, 0, 0)
    assert snap.providers[0].enabled is False
    assert (snap.queue_depth, snap.oldest_wait_ms) == (0, 0.0)


async def test_snapshot_counts_leases_and_distinct_queued_requests_r_pool_8() -> None:
    clock = Clock()
    pool = ProviderPool(POLICY, clock=clock)
    pool.node_ready("n1", 1)
    pool.node_ready("n2", 1)
    held = [await pool.acquire("m", long=True)]  # z-remote: lowest priority value
    held += [await pool.acquire("m") for _ in range(4)]  # fills z-remote (3) and b-local (2)
    waiters = [await enqueue(pool, "m")]
    clock.now += 0.25
    waiters.append(await enqueue(pool, "other"))
    clock.now += 0.25
    snap = pool.snapshot()
    rows = {r.provider_id: r for r in snap.providers}
    assert (rows["z-remote"].in_flight, rows["z-remote"].long_in_flight) == (3, 1)
    assert (rows["b-local"].in_flight, rows["b-local"].long_in_flight) == (2, 0)
    # "m" waiter lists both providers; "other" waiter lists b-local only.
    assert (rows["b-local"].queued, rows["z-remote"].queued, rows["a-local"].queued) == (2, 1, 0)
    assert snap.queue_depth == 2 and snap.oldest_wait_ms == 500.0

    pool.node_gone("n2", 1)  # offline: effective figures 0, leases still counted inside
    offline = next(r for r in pool.snapshot().providers if r.provider_id == "z-remote")
    assert not offline.online and (offline.in_flight, offline.queued) == (0, 0)
    assert offline.capacity == 3 and not pool.idle()

    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    for lease in held:
        pool.release(lease)
    assert pool.idle()


def test_snapshot_as_dict_is_json_ready_r_pool_8() -> None:
    data = json.loads(json.dumps(ProviderPool(POLICY).snapshot().as_dict()))
    assert data["queue_depth"] == 0 and data["oldest_wait_ms"] == 0.0
    assert data["providers"][1] == {
        "node_id": "n1",
        "provider_id": "b-local",
        "online": False,
        "capacity": 2,
        "in_flight": 0,
        "long_in_flight": 0,
        "queued": 0,
        "priority": 20,
        "enabled": True,
        "long_capacity": 1,
        "unavailable": None,
        "health": "healthy",
        "health_reason": "",
        "ejected_for_s": 0.0,
        "consecutive_failures": 0,
    }
