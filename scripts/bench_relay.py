"""Which Redis transport relays a run's events from one Edge to another (R-SCALE-2).

A producer process sends a stream of run events to a consumer process through the local
Redis, three ways: the Channels channel layer (``channels_redis``), Redis streams
(XADD / XREAD BLOCK) and pub/sub (PUBLISH / SUBSCRIBE). Each event carries its send time
(``time.time_ns``, one machine's clock for both processes); the consumer records the
latency of each. Two runs per transport and size: *burst* (events sent as fast as the
transport takes them: events/s) and *paced* (one event per ``--gap-ms``: latency with
nothing queued). Bounded by ``--events`` and ``--max-s`` per case. Reports, never asserts;
the figures and the choice are in docs/scale-out.md ("Run routing between Edges").

    python scripts/bench_relay.py [--redis redis://127.0.0.1:6379/0] [--events 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

SIZES = {"small": 100, "8KB": 8 * 1024}
TRANSPORTS = ("channels_redis", "streams", "pubsub")


def _payload(size: int) -> bytes:
    return (b'data: {"choices":[{"delta":{"content":"' + b"x" * size)[:size]


def _stamp(payload: bytes) -> bytes:
    return b"%d|" % time.time_ns() + payload


def _latency_us(frame: bytes) -> float:
    return (time.time_ns() - int(frame.split(b"|", 1)[0])) / 1000


def _layer(url: str, prefix: str) -> Any:
    from channels_redis.core import RedisChannelLayer

    return RedisChannelLayer(hosts=[url], prefix=prefix, capacity=100_000, expiry=60)


async def _consume(transport: str, url: str, key: str, count: int, max_s: float,
                   ready: Any, out: Any) -> None:  # fmt: skip
    import redis.asyncio as redis

    latencies: list[float] = []
    first = last = 0.0
    deadline = time.monotonic() + max_s + 5

    def seen(frame: bytes) -> None:
        nonlocal first, last
        latencies.append(_latency_us(frame))
        last = time.monotonic()
        first = first or last

    if transport == "channels_redis":
        layer = _layer(url, key)
        ready.set()
        while len(latencies) < count and time.monotonic() < deadline:
            try:
                async with asyncio.timeout(1):
                    message = await layer.receive("relay")
            except TimeoutError:
                continue
            seen(message["d"])
        await layer.flush()
    else:
        client = redis.Redis.from_url(url)
        if transport == "streams":
            last_id = "0-0"  # the key is new: read from its start
            ready.set()
            while len(latencies) < count and time.monotonic() < deadline:
                reply = await client.xread({key: last_id}, count=500, block=1000)
                for _stream, entries in reply:
                    for entry_id, fields in entries:
                        last_id = entry_id
                        seen(fields[b"d"])
        else:
            pubsub = client.pubsub()
            await pubsub.subscribe(key)
            await pubsub.get_message(timeout=1)  # the subscribe confirmation
            ready.set()
            while len(latencies) < count and time.monotonic() < deadline:
                message = await pubsub.get_message(timeout=1)
                if message is not None and message["type"] == "message":
                    seen(message["data"])
            await pubsub.aclose()
        await client.aclose()
    out.put((latencies, max(last - first, 1e-9)))


def _consumer(*args: Any) -> None:
    asyncio.run(_consume(*args))


async def _produce(transport: str, url: str, key: str, payload: bytes, count: int,
                   gap_s: float, max_s: float) -> int:  # fmt: skip
    import redis.asyncio as redis

    stop = time.monotonic() + max_s
    sent = 0
    layer = _layer(url, key) if transport == "channels_redis" else None
    client = redis.Redis.from_url(url)
    while sent < count and time.monotonic() < stop:
        frame = _stamp(payload)
        if layer is not None:
            await layer.send("relay", {"type": "run.event", "d": frame})
        elif transport == "streams":
            await client.xadd(key, {"d": frame}, maxlen=10_000, approximate=True)
        else:
            await client.publish(key, frame)
        sent += 1
        if gap_s:
            await asyncio.sleep(gap_s)
    await client.aclose()
    return sent


def run_case(transport: str, url: str, size: int, count: int, gap_s: float,
             max_s: float) -> dict[str, float]:  # fmt: skip
    ctx = mp.get_context("spawn")
    key = f"benchrelay:{secrets.token_hex(4)}"
    ready, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_consumer, args=(transport, url, key, count, max_s, ready, out))
    proc.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("consumer did not start")
        sent = asyncio.run(_produce(transport, url, key, _payload(size), count, gap_s, max_s))
        latencies, span = out.get(timeout=max_s + 30)
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
        _cleanup(url, key)
    latencies.sort()
    n = len(latencies)
    return {
        "sent": sent,
        "received": n,
        "p50_us": statistics.median(latencies) if n else float("nan"),
        "p99_us": latencies[min(n - 1, int(n * 0.99))] if n else float("nan"),
        "events_s": n / span if n > 1 else float("nan"),
    }


async def _router_case(
    url: str, size: int, count: int, gap_s: float, max_s: float
) -> dict[str, float]:
    """The implementation itself: a streamed run requested on Edge A, its Node on Edge B
    (both hubs in this one process, a fake Node socket), output read as a client would."""
    import redis.asyncio as redis

    from catalog.config import load_snapshot
    from nodes import wire
    from nodes.hub import NodeHub
    from nodes.remote import NO_FENCE, RunRouter
    from nodes.runs import RunOrder
    from pool.engine import Lease, ProviderPool
    from pool.policy import policy_from_snapshot
    from tests.support.config_examples import example_document
    from tests.support.routing import FrameLog

    os.environ["IOP_ALLOW_EXAMPLE_TOKEN_HASHES"] = "1"  # a throwaway document, loopback only
    snapshot = load_snapshot(example_document())
    prefix = f"benchrelay:{secrets.token_hex(4)}"
    hubs = [NodeHub(lambda: snapshot, ProviderPool(policy_from_snapshot(snapshot))) for _ in "ab"]
    routers = [
        RunRouter(url, prefix=prefix, edge_id=f"edge-{name}", local=hub)
        for name, hub in zip("ab", hubs, strict=True)
    ]
    for hub, router in zip(hubs, routers, strict=True):
        hub.remote = router
    client = redis.Redis.from_url(url)
    node = FrameLog()
    session = await hubs[1].connect("node-a", node)
    await hubs[1].receive(session, wire.encode(wire.Register(node_id="node-a")))
    response = node.sent[-1]
    assert isinstance(response, wire.RegisterResponse)
    ready = wire.Ready(generation=response.generation, revision=response.payload.revision)
    await hubs[1].receive(session, wire.encode(ready))
    for name in "ab":
        await client.set(f"{prefix}:alive:edge-{name}", NO_FENCE, px=600_000)
    await client.hset(f"{prefix}:node:node-a", mapping={"edge": "edge-b", "fence": NO_FENCE})
    for router in routers:
        await router.start()
    lease = Lease(request_id=1, node_id="node-a", provider_id="cli-a", model="echo", long=False)
    order = RunOrder(tunnel=False, operation="chat_completions", stream=True, body=b"{}")
    window = 256 * 1024
    channel = await hubs[0].open_run(lease, order, window=window)
    for _ in range(5000):
        if node.runs():
            break
        await asyncio.sleep(0.001)
    run_id = node.runs()[-1].run_id
    payload = _payload(size).decode()
    latencies: list[float] = []
    start = time.monotonic()

    async def feed() -> None:
        sent = 0
        for _ in range(count):
            if time.monotonic() - start > max_s:
                break
            data = _stamp(payload.encode()).decode() + "\n"
            for _ in range(100_000):  # the Node waits for credit, as a real one does
                if sent + len(data) <= window + node.credit(run_id):
                    break
                await asyncio.sleep(0.0005)
            sent += len(data)
            await hubs[1].receive(session, wire.encode(wire.RunEvent(run_id=run_id, data=data)))
            await asyncio.sleep(gap_s)
        await hubs[1].receive(session, wire.encode(wire.RunEnd(run_id=run_id, ok=True)))

    feeder = asyncio.get_running_loop().create_task(feed())
    while True:
        item = await channel.get()
        if isinstance(item, wire.RunEnd):
            break
        now = time.time_ns()
        for event in item.split("\n")[:-1]:
            latencies.append((now - int(event.split("|", 1)[0])) / 1000)
        channel.release()
    span = time.monotonic() - start
    await feeder
    hubs[0].close_run(channel)
    for router in routers:
        await router.aclose()
    for hub in hubs:
        await hub.aclose()
    async for key in client.scan_iter(match=f"{prefix}*"):
        await client.delete(key)
    await client.aclose()
    latencies.sort()
    n = len(latencies)
    return {
        "sent": count,
        "received": n,
        "p50_us": statistics.median(latencies) if n else float("nan"),
        "p99_us": latencies[min(n - 1, int(n * 0.99))] if n else float("nan"),
        "events_s": n / span if n > 1 else float("nan"),
    }


def _cleanup(url: str, key: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    for name in client.scan_iter(match=f"{key}*", count=1000):
        client.delete(name)
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--redis", default=os.environ.get("IOP_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--events", type=int, default=5000, help="burst events per case")
    parser.add_argument("--paced-events", type=int, default=1000)
    parser.add_argument("--gap-ms", type=float, default=1.0)
    parser.add_argument("--max-s", type=float, default=20.0, help="bound on one case")
    parser.add_argument("--transport", choices=TRANSPORTS, action="append")
    parser.add_argument(
        "--router", action="store_true", help="measure nodes.remote.RunRouter (hub to hub)"
    )
    args = parser.parse_args()
    print(f"{'transport':<15} {'size':<6} {'mode':<6} {'recv':>7} "
          f"{'p50 us':>9} {'p99 us':>9} {'events/s':>10}")  # fmt: skip
    if args.router:
        for label, size in SIZES.items():
            for mode, count, gap in (("burst", args.events, 0.0),
                                     ("paced", args.paced_events, args.gap_ms / 1000)):  # fmt: skip
                r = asyncio.run(_router_case(args.redis, size, count, gap, args.max_s))
                rate = f"{r['events_s']:>10.0f}" if mode == "burst" else f"{'-':>10}"
                print(f"{'RunRouter':<15} {label:<6} {mode:<6} {r['received']:>7.0f} "
                      f"{r['p50_us']:>9.0f} {r['p99_us']:>9.0f} {rate}", flush=True)  # fmt: skip
        return
    for transport in args.transport or TRANSPORTS:
        for label, size in SIZES.items():
            for mode, count, gap in (("burst", args.events, 0.0),
                                     ("paced", args.paced_events, args.gap_ms / 1000)):  # fmt: skip
                r = run_case(transport, args.redis, size, count, gap, args.max_s)
                rate = f"{r['events_s']:>10.0f}" if mode == "burst" else f"{'-':>10}"
                print(f"{transport:<15} {label:<6} {mode:<6} {r['received']:>7.0f} "
                      f"{r['p50_us']:>9.0f} {r['p99_us']:>9.0f} {rate}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
