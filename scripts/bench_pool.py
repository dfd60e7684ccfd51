"""Benchmark of the pool engine (``make bench-pool``); prints Markdown tables for docs/pool.md.

Topology: N providers, 10 per node; N/10 model groups of 10 providers each (every group spans
10 nodes), capacity 4, long capacity 1, capability ``chat``. Waiters are real asyncio tasks
blocked in ``ProviderPool.acquire``. Bounded: a few seconds per section, < 60 s in total.
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pool.engine import HealthPolicy, Lease, PoolEngine, PoolPolicy, PoolProvider, ProviderPool

CHAT = frozenset({"chat"})
GROUP_SIZE = 10


def topology(
    n: int,
    *,
    group_size: int = GROUP_SIZE,
    busy: bool = False,
    prio_shift: int = 0,
    queue: int = 16,
) -> PoolPolicy:
    """N providers in groups of ``group_size``; optionally a separate one-slot "busy" group."""
    groups_n = max(1, n // group_size)
    providers = [
        PoolProvider(f"node-{i // 10}", f"p{i}", 4, 1, (i + prio_shift) % 7, True, CHAT)
        for i in range(n)
    ]
    groups = {f"g{k}": tuple(f"p{i}" for i in range(k, n, groups_n)) for k in range(groups_n)}
    if busy:
        providers.append(PoolProvider("node-busy", "busy", 1, 0, 0, True, CHAT))
        groups["busy"] = ("busy",)
    return PoolPolicy(tuple(providers), groups, max_queue=queue, queue_timeout_ms=30_000)


def ready(pool: PoolEngine, policy: PoolPolicy) -> None:
    for node in sorted({p.node_id for p in policy.providers}):
        pool.node_ready(node, 1)


async def park(
    pool: ProviderPool, granted: list[Lease], models: list[str], long_every: int = 0
) -> list[asyncio.Task[None]]:
    """Queue one waiter per model entry, in order; each granted lease is appended to ``granted``."""

    async def wait(model: str, long: bool) -> None:
        granted.append(await pool.acquire(model, CHAT, long=long))

    start = pool.snapshot().queue_depth
    tasks = [
        asyncio.create_task(wait(m, bool(long_every) and i % long_every == 0))
        for i, m in enumerate(models)
    ]
    for _ in range(1000):
        if pool.snapshot().queue_depth == start + len(models):
            break
        await asyncio.sleep(0)
    else:
        raise RuntimeError("waiters did not reach the queue")
    return tasks


async def unpark(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def new_pool(policy: PoolPolicy) -> ProviderPool:
    pool = ProviderPool(policy)
    ready(pool, policy)
    return pool


async def admit_release(
    n: int, waiters: int, group_size: int = GROUP_SIZE, rounds: int = 20_000
) -> tuple[float, float]:
    """Admit + release on free providers while ``waiters`` wait on a separate full group."""
    policy = topology(n, group_size=group_size, busy=True, queue=waiters + 16)
    pool = new_pool(policy)
    await pool.acquire("busy", CHAT)  # the busy group is full: its waiters stay queued
    tasks = await park(pool, [], ["busy"] * waiters)
    rate, median = await admit_loop(pool, [m for m in policy.groups if m != "busy"], rounds)
    await unpark(tasks)
    return rate, median


async def admit_loop(pool: ProviderPool, models: list[str], rounds: int) -> tuple[float, float]:
    """``rounds`` admit + release pairs over ``models``: (rate per second, median µs)."""
    samples = []
    perf = time.perf_counter_ns
    began = perf()
    for i in range(rounds):
        t0 = perf()
        lease = await pool.acquire(models[i % len(models)], CHAT)
        pool.release(lease)
        samples.append(perf() - t0)
    elapsed = (perf() - began) / 1e9
    return rounds / elapsed, statistics.median(samples) / 1e3


async def admit_release_ejected(
    n: int, ejected_pct: int, rounds: int = 20_000
) -> tuple[float, float, int]:
    """Admit + release with ``ejected_pct`` % of the providers ejected, spread evenly over
    the groups (the first members of each group; 0 = all healthy)."""
    policy = topology(n)
    policy = PoolPolicy(
        policy.providers,
        policy.groups,
        max_queue=policy.max_queue,
        queue_timeout_ms=policy.queue_timeout_ms,
        health=HealthPolicy(eject_after_failures=1, eject_base_s=3600, eject_max_s=3600),
    )
    pool = new_pool(policy)
    out = n * ejected_pct // 100  # group of p{i} is i % groups: p0.. spread over all groups
    for p in policy.providers[:out]:
        pool.probed(p.node_id, p.provider_id, False, "bench")  # one failure ejects
    assert sum(r.health == "ejected" for r in pool.snapshot().providers) == out
    rate, median = await admit_loop(pool, list(policy.groups), rounds)
    return rate, median, out


async def fill(pool: ProviderPool, policy: PoolPolicy) -> list[Lease]:
    """Hold every slot of every provider (4 normal, one of them long)."""
    held = []
    for model in policy.groups:
        size = len(policy.groups[model])
        held += [await pool.acquire(model, CHAT, long=True) for _ in range(size)]
        held += [await pool.acquire(model, CHAT) for _ in range(3 * size)]
    return held


async def next_waiter(n: int, waiting: int, rounds: int = 2_000) -> tuple[float, float]:
    """Cost of one release that hands the slot to the next waiter, ``waiting`` queued."""
    policy = topology(n, queue=waiting + rounds + 16)
    pool = new_pool(policy)
    held = await fill(pool, policy)
    models = list(policy.groups)
    granted: list[Lease] = []
    tasks = await park(pool, granted, [models[i % len(models)] for i in range(waiting + rounds)], 7)
    samples = []
    perf = time.perf_counter_ns
    for i in range(rounds):
        lease = held[(i * 37) % len(held)]
        t0 = perf()
        pool.release(lease)
        samples.append(perf() - t0)
        for _ in range(10):  # let the granted task record its lease
            if granted:
                break
            await asyncio.sleep(0)
        else:
            raise RuntimeError("a release dispatched no waiter")
        held[(i * 37) % len(held)] = granted.pop()
    depth = pool.snapshot().queue_depth
    assert depth == waiting, f"each release must dispatch exactly one waiter ({depth})"
    await unpark(tasks)
    return statistics.median(samples) / 1e3, sorted(samples)[int(len(samples) * 0.99)] / 1e3


async def apply_cost(n: int, waiting: int, rounds: int = 21) -> float:
    """One apply (priorities change, nothing can run) with ``waiting`` waiters queued."""
    policies = [topology(n, queue=waiting + 16, prio_shift=s) for s in (0, 3)]
    pool = new_pool(policies[0])
    await fill(pool, policies[0])
    models = list(policies[0].groups)
    tasks = await park(pool, [], [models[i % len(models)] for i in range(waiting)], 7)
    samples = []
    for i in range(rounds):
        t0 = time.perf_counter_ns()
        pool.apply(policies[(i + 1) % 2])
        samples.append(time.perf_counter_ns() - t0)
    assert pool.snapshot().queue_depth == waiting
    await unpark(tasks)
    return statistics.median(samples) / 1e6


REDIS_URL = os.environ.get("IOP_BENCH_REDIS_URL") or os.environ.get(
    "IOP_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"
)


async def round_trips(pool: PoolEngine, models: list[str], rounds: int) -> float:
    """Median µs of one admit + release, the release having reached the engine's store."""
    samples = []
    flush = getattr(pool, "flush", None)
    for i in range(rounds):
        t0 = time.perf_counter_ns()
        lease = await pool.acquire(models[i % len(models)], CHAT)
        pool.release(lease)
        if flush is not None:
            await flush()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1e3


async def concurrent(pools: list[PoolEngine], models: list[str], clients: int, s: float) -> float:
    """Admit + release per second with ``clients`` loops per pool for about ``s`` seconds."""
    done = 0
    stop = time.perf_counter() + s

    async def client(pool: PoolEngine, k: int) -> None:
        nonlocal done
        while time.perf_counter() < stop:
            lease = await pool.acquire(models[(done + k) % len(models)], CHAT)
            pool.release(lease)
            done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(client(p, k) for p in pools for k in range(clients)))
    return done / (time.perf_counter() - t0)


async def deep_queue(edge: PoolEngine, policy: PoolPolicy) -> list[asyncio.Task[None]]:
    """A full one-provider group and 1000 waiters for it in the shared queue."""
    edge.apply(
        PoolPolicy(
            (*policy.providers, PoolProvider("node-busy", "busy", 1, 0, 0, True, CHAT)),
            {**policy.groups, "busy": ("busy",)},
            max_queue=2000,
            queue_timeout_ms=policy.queue_timeout_ms,
        )
    )
    edge.node_ready("node-busy", 1)
    await edge.acquire("busy", CHAT)

    async def wait() -> None:
        await edge.acquire("busy", CHAT)

    tasks = [asyncio.create_task(wait()) for _ in range(1000)]
    for _ in range(1000):
        if (await edge.fetch_snapshot()).queue_depth == 1000:  # type: ignore[attr-defined]
            return tasks
        await asyncio.sleep(0.01)
    raise RuntimeError("waiters did not reach the queue")


async def redis_section(runs: int = 5, rounds: int = 400) -> None:
    """The Redis engine (several Edges, docs/pool.md) against the in-memory one."""
    import secrets

    import redis

    from pool.engine_redis import RedisPool

    print("\nRedis engine (several Edges): one admit + release round trip per request, the")
    print(f"release written to Redis; median of {runs} runs of {rounds} (10 providers, group of")
    print("10, capacity 4); throughput: 16 concurrent clients per Edge; the last row with 1000")
    print("waiters of another (full) model in the one queue\n")
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
    except redis.ConnectionError:
        print(f"(skipped: no Redis at {REDIS_URL})")
        return
    prefix = f"iop-bench-{secrets.token_hex(4)}"
    client = redis.Redis.from_url(REDIS_URL)
    client.hset(f"{prefix}:epoch", mapping={"id": "bench", "born_ms": 0})  # not recovering
    policy = topology(10, queue=1024)
    models = list(policy.groups)
    memory = new_pool(policy)
    edges = [
        RedisPool(policy, redis_url=REDIS_URL, prefix=prefix, edge_id=f"bench-{i}")
        for i in range(2)
    ]
    try:
        for edge in edges:
            await edge.start()
        ready(edges[0], policy)
        await edges[0].flush()
        print("| engine | Edges | round trip median µs | admit+release/s (concurrent) |")
        print("| --- | ---: | ---: | ---: |")
        rows: list[tuple[str, int, PoolEngine, list[PoolEngine]]] = [
            ("in memory", 1, memory, [memory]),
            ("Redis", 1, edges[0], [edges[0]]),
            ("Redis", 2, edges[0], list(edges)),
            ("Redis, 1000 queued", 2, edges[0], list(edges)),
        ]
        parked: list[asyncio.Task[None]] = []
        for name, count, pool, pools in rows:
            if name.endswith("queued"):
                # 1000 waiters of another model sit in the one queue from here on
                parked = await deep_queue(edges[1], policy)
            median = statistics.median(
                [await round_trips(pool, models, rounds) for _ in range(runs)]
            )
            rate = await concurrent(pools, models, 16, 2.0)
            for edge in edges:
                await edge.flush()
            print(f"| {name} | {count} | {median:,.1f} | {rate:,.0f} |", flush=True)
        await unpark(parked)
    finally:
        for edge in edges:
            await edge.aclose()
        keys = list(client.scan_iter(f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()


async def timed(label: str, work: Callable[[], Awaitable[str]]) -> None:
    t0 = time.perf_counter()
    line = await work()
    print(line, flush=True)
    if os.environ.get("BENCH_VERBOSE"):
        print(f"  ({label}: {time.perf_counter() - t0:.1f} s)", file=sys.stderr)


async def main() -> None:
    began = time.perf_counter()
    print(f"Python {platform.python_version()}, {os.cpu_count()} CPUs, {platform.machine()}\n")
    print("admit + release (free provider; waiters queued on another, full group)\n")
    print("| providers | candidates | waiters | admit+release/s | median µs |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for n in (10, 100, 1000):
        for waiters in (0, 1_000, 10_000):

            async def row(n: int = n, waiters: int = waiters) -> str:
                rate, median = await admit_release(n, waiters)
                return f"| {n} | {min(n, GROUP_SIZE)} | {waiters} | {rate:,.0f} | {median:.1f} |"

            await timed(f"admit {n}/{waiters}", row)

    print("\nprovider health (R-HEALTH-2): admit + release, all healthy vs 10% ejected\n")
    print("| providers | ejected | admit+release/s | median µs |")
    print("| ---: | ---: | ---: | ---: |")
    logging.getLogger("iop.pool.health").disabled = True  # one line per ejection otherwise
    for n in (100, 1000):
        for pct in (0, 10):

            async def row5(n: int = n, pct: int = pct) -> str:
                rate, median, out = await admit_release_ejected(n, pct)
                return f"| {n} | {out} | {rate:,.0f} | {median:.1f} |"

            await timed(f"health {n}/{pct}", row5)

    print("\nnext-waiter dispatch: one release hands its slot to the earliest eligible waiter")
    print("(1000 providers all full; waiters spread over 100 groups, every 7th one long)\n")
    print("| providers | waiting | median µs | p99 µs |")
    print("| ---: | ---: | ---: | ---: |")
    for waiting in (1_000, 10_000):

        async def row2(waiting: int = waiting) -> str:
            median, p99 = await next_waiter(1000, waiting)
            return f"| 1000 | {waiting} | {median:.1f} | {p99:.1f} |"

        await timed(f"dispatch {waiting}", row2)

    print("\nfull re-evaluation: one apply (new priorities) over the queued waiters\n")
    print("| providers | waiting | median ms |")
    print("| ---: | ---: | ---: |")
    for waiting in (0, 1_000, 10_000):

        async def row3(waiting: int = waiting) -> str:
            return f"| 1000 | {waiting} | {await apply_cost(1000, waiting):.2f} |"

        await timed(f"apply {waiting}", row3)

    print("\nwide group: one model group of all providers (selection is O(candidates))\n")
    print("| providers | candidates | waiters | admit+release/s | median µs |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for n in (100, 1000):

        async def row4(n: int = n) -> str:
            rate, median = await admit_release(n, 0, group_size=n, rounds=5_000)
            return f"| {n} | {n} | 0 | {rate:,.0f} | {median:.1f} |"

        await timed(f"wide {n}", row4)
    await redis_section()
    print(f"\nwhole bench: {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    asyncio.run(main())
