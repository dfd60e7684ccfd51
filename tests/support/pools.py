"""Pool engine tests: providers, a pool whose nodes are ready, a waiter in the queue."""

from __future__ import annotations

import asyncio

from pool.engine import Lease, PoolPolicy, PoolProvider, ProviderPool
from tests.support.clock import Clock


def prov(
    pid: str,
    node: str = "n1",
    cap: int = 1,
    long_cap: int = 0,
    prio: int = 10,
    enabled: bool = True,
    caps: tuple[str, ...] = ("chat",),
) -> PoolProvider:
    return PoolProvider(node, pid, cap, long_cap, prio, enabled, frozenset(caps))


def ready_pool(
    *providers: PoolProvider,
    groups: dict[str, tuple[str, ...]] | None = None,
    ready: tuple[str, ...] | None = None,
    max_queue: int = 16,
    timeout_ms: int = 0,
    clock: Clock | None = None,
) -> ProviderPool:
    """A pool over ``providers`` (one group ``m`` of all of them unless ``groups``), every node
    of theirs ready (or only ``ready``), on a hand-driven clock."""
    groups = groups or {"m": tuple(p.provider_id for p in providers)}
    policy = PoolPolicy(providers, groups, max_queue=max_queue, queue_timeout_ms=timeout_ms)
    pool = ProviderPool(policy, clock=clock or Clock())
    for node in ready if ready is not None else sorted({p.node_id for p in providers}):
        pool.node_ready(node, 1)
    return pool


async def enqueue(
    pool: ProviderPool, model: str = "m", *, long: bool = False
) -> asyncio.Task[Lease]:
    """Start an ``acquire`` and return once it waits in the queue (bounded)."""
    depth = pool.snapshot().queue_depth
    task = asyncio.create_task(pool.acquire(model, long=long))
    for _ in range(100):
        if pool.snapshot().queue_depth == depth + 1:
            return task
        await asyncio.sleep(0)
    raise AssertionError("the waiter never reached the queue")
