"""The capacity plan of one Redis primary (R-HA-5, docs/scale-out.md "Capacity plan").

Simulates Edges on this machine: each is a ``RedisPool`` (the Edge's own engine and writer)
with 16 concurrent clients doing admit + release, against a redis-server of this script's own
on a free loopback port (so its statistics are this load's only). For each cell it reads
Redis's own counters before and after: commands (``INFO commandstats``), round trips (the
Edges' writer batches), and the CPU time Redis spent (``INFO cpu``). Redis runs scripts on
one thread, so the requests per second one primary carries is at most 1 / (its CPU time per
request); the table prints that ceiling beside the rate reached on this machine.

``IOP_CAPACITY_SECONDS`` (default 3) is each cell's length.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from bench_pool import concurrent  # this directory: make bench-pool's client loop

from pool.engine import PoolPolicy, PoolProvider
from pool.engine_redis import RedisPool

CHAT = frozenset({"chat"})
CLIENTS = 16  # per Edge
CELLS = [  # (Edges, providers, waiters parked in the one queue)
    (1, 10, 0),
    (2, 10, 0),
    (4, 10, 0),
    (8, 10, 0),
    (4, 100, 0),
    (4, 10, 1000),
]


def policy(providers: int) -> PoolPolicy:
    rows = tuple(
        PoolProvider(f"node-{i // 10}", f"p{i}", 4, 1, 0, True, CHAT) for i in range(providers)
    )
    groups = {f"m{g}": tuple(f"p{i}" for i in range(g * 10, g * 10 + 10))
              for g in range(providers // 10)}  # fmt: skip
    busy = PoolProvider("node-busy", "busy", 1, 0, 0, True, CHAT)
    return PoolPolicy(
        (*rows, busy), {**groups, "busy": ("busy",)}, max_queue=2000, queue_timeout_ms=0
    )


def stats(client: redis.Redis) -> tuple[int, int, float]:
    """(commands Redis ran, scripts among them, CPU seconds it used) so far; the commands
    count those a script calls."""
    commands = client.info("commandstats")
    calls = sum(int(v["calls"]) for v in commands.values())
    scripts = int(commands.get("cmdstat_evalsha", {}).get("calls", 0))
    cpu = client.info("cpu")
    return calls, scripts, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


async def cell(url: str, edges_n: int, providers: int, waiters: int, seconds: float) -> str:
    prefix = f"iop-capacity-{secrets.token_hex(4)}"
    client = redis.Redis.from_url(url)
    client.hset(f"{prefix}:epoch", mapping={"id": "bench", "born_ms": 0})  # not recovering
    pol = policy(providers)
    edges = [RedisPool(pol, redis_url=url, prefix=prefix, edge_id=f"e{i}") for i in range(edges_n)]
    parked: list[asyncio.Task[Any]] = []
    try:
        for edge in edges:
            await edge.start()
        for n in range(providers // 10):
            edges[n % edges_n].node_ready(f"node-{n}", 1)
        edges[0].node_ready("node-busy", 1)
        await edges[0].flush()
        if waiters:
            await edges[0].acquire("busy", CHAT)
            parked = [asyncio.create_task(edges[0].acquire("busy", CHAT)) for _ in range(waiters)]
            while (await edges[0].fetch_snapshot()).queue_depth < waiters:  # noqa: ASYNC110
                await asyncio.sleep(0.01)  # the waiters' admissions reach Redis
        models = [m for m in pol.groups if m != "busy"]
        sent = [0]
        original = [e._send for e in edges]

        def counted(send: Any) -> Any:
            async def wrapper(jobs: Any) -> Any:
                sent[0] += 1
                return await send(jobs)

            return wrapper

        for edge in edges:
            edge._send = counted(edge._send)  # type: ignore[method-assign]
        calls0, scripts0, cpu0 = stats(client)
        t0 = time.perf_counter()
        rate = await concurrent(list(edges), models, CLIENTS, seconds)  # make bench-pool's loop
        done = rate * (time.perf_counter() - t0)  # the requests it made
        for edge in edges:
            await edge.flush()
        calls1, scripts1, cpu1 = stats(client)
        for edge, send in zip(edges, original, strict=True):
            edge._send = send  # type: ignore[method-assign]
        per, scripts = (calls1 - calls0) / done, (scripts1 - scripts0) / done
        cpu_us = (cpu1 - cpu0) / done * 1e6
        cells = [str(edges_n), str(providers), str(waiters), f"{rate:,.0f}",
                 f"{scripts:.2f}", f"{per:.0f}", f"{sent[0] / done:.2f}", f"{cpu_us:.0f}",
                 f"{1e6 / cpu_us:,.0f}"]  # fmt: skip
        return "| " + " | ".join(cells) + " |"
    finally:
        for task in parked:
            task.cancel()
        for edge in edges:
            await edge.aclose()
        client.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis() -> tuple[subprocess.Popen[bytes], str, str]:
    """A redis-server of this script's own on a free loopback port, answering."""
    port = free_port()
    directory = tempfile.mkdtemp(prefix="iop-capacity-")
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", directory],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(200):
        try:
            redis.Redis.from_url(url).ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)  # waiting for the child process to listen
    return server, url, directory


async def main(url: str) -> None:
    seconds = float(os.environ.get("IOP_CAPACITY_SECONDS", "3"))
    print(f"Redis capacity plan: {CLIENTS} clients per simulated Edge doing admit + release, "
          f"{seconds:g} s per row, one redis-server on this machine\n")  # fmt: skip
    print("| Edges | providers | waiters queued | requests/s here | scripts per request | "
          "Redis commands per request (in scripts too) | round trips per request | Redis "
          "CPU µs per request | ceiling of one primary (requests/s) |")  # fmt: skip
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for edges_n, providers, waiters in CELLS:
        print(await cell(url, edges_n, providers, waiters, seconds), flush=True)


if __name__ == "__main__":
    redis_server, redis_url, redis_dir = start_redis()
    try:
        asyncio.run(main(redis_url))
    finally:
        redis_server.terminate()
        redis_server.wait(10)
        shutil.rmtree(redis_dir, ignore_errors=True)
