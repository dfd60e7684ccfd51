"""Open streams in `make bench` (the ``streams`` epilogue; docs/performance.md).

A fresh Edge+Node (provider capacity above the count), then ``STREAMS`` clients at once, each
holding a streamed chat whose upstream sends its first event and then nothing
(``bench-hold`` in scripts/bench_upstream.py). Once every client has its first event, the
Edge's and the Node's RSS are read; RSS per open stream is (that - RSS after a warm-up of the
same streams opened and closed) / count. The clients then leave; the Edge must end every run.
Bounded: ``TIMEOUT_S`` for the whole measurement.
"""

from __future__ import annotations

import asyncio
import json
import time

from bench_cells import BenchContext, edge_stack, epilogue
from bench_client import load_average, rss_mb

STREAMS = 1000
BATCH = 100  # connections opened at once
TIMEOUT_S = 90.0
BODY = json.dumps(
    {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "bench-hold"}]}
).encode()


async def _open(port: int, token: str) -> asyncio.StreamWriter:
    """One client: the request sent, its first ``data:`` event read; the socket stays open."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(BODY)}\r\n\r\n"
        ).encode()
        + BODY
    )
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        writer.close()
        raise RuntimeError(head.split(b"\r\n", 1)[0].decode())
    await reader.readuntil(b"data:")
    return writer


async def _hold(port: int, token: str, count: int) -> list[asyncio.StreamWriter]:
    writers: list[asyncio.StreamWriter] = []
    try:
        for start in range(0, count, BATCH):
            n = min(BATCH, count - start)
            writers += await asyncio.gather(*(_open(port, token) for _ in range(n)))
    except BaseException:
        _close(writers)
        raise
    return writers


def _close(writers: list[asyncio.StreamWriter]) -> None:
    for writer in writers:
        writer.close()


async def _leave(writers: list[asyncio.StreamWriter]) -> None:
    """Close every client socket, and let the loop actually close them."""
    _close(writers)
    await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)


async def _measure(ctx: BenchContext) -> str:
    with edge_stack(ctx, "edge-streams", capacity=STREAMS + 64) as target:
        edge, node = target.pids["edge"], target.pids["node"]
        load1 = load_average()
        await _leave(await _hold(target.port, target.token, BATCH))  # warm-up: imports, pools
        await asyncio.sleep(1.0)
        before = {name: rss_mb(pid)[0] for name, pid in (("edge", edge), ("node", node))}
        started = time.monotonic()
        writers = await _hold(target.port, target.token, STREAMS)
        opened = time.monotonic() - started
        await asyncio.sleep(1.0)  # what each open stream keeps, not what opening it took
        during = {name: rss_mb(pid)[0] for name, pid in (("edge", edge), ("node", node))}
        await _leave(writers)
    per = {k: (during[k] - before[k]) * 1024 / STREAMS for k in before}
    return (
        f"Open streams: {STREAMS} held at once (opened in {opened:.1f} s, load {load1:.2f}): "
        f"Edge RSS {before['edge']:.0f} -> {during['edge']:.0f} MB, {per['edge']:.1f} KB per "
        f"stream; Node {before['node']:.0f} -> {during['node']:.0f} MB, {per['node']:.1f} KB per "
        f"stream (target: Edge <= 16 KB)"
    )


@epilogue
def streams_epilogue(ctx: BenchContext) -> str:
    """RSS per open stream on the Edge (and the Node), after the rounds."""
    if ctx.options.suite and "streams" not in ctx.options.suite:
        return ""
    try:
        return asyncio.run(asyncio.wait_for(_measure(ctx), TIMEOUT_S))
    except (OSError, RuntimeError, TimeoutError, AssertionError) as exc:
        return f"Open streams: not measured ({type(exc).__name__}: {exc})"
