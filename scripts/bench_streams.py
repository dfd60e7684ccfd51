"""Open streams in `make bench` (the ``streams`` epilogue; docs/performance.md).

A fresh Edge+Node (provider capacity above the count), then ``STREAMS`` clients at once, each
holding a streamed chat whose upstream sends its first event and then nothing
(``bench-hold`` in scripts/bench_upstream.py). Once every client has its first event, the
Edge's and the Node's RSS are read; RSS per open stream is (that - RSS after a warm-up of the
same streams opened and closed) / count. The clients then leave; the Edge must end every run.
Bounded: ``TIMEOUT_S`` for each Edge measured. With ``--baseline REV`` that revision's Edge+Node
is measured the same way first; with ``--diagnose DIR`` the Edge's objects are also counted by
type after the warm-up and while the streams are held (``IOP_BENCH_OBJECTS``,
scripts/bench_diag/sitecustomize.py), and the largest differences per stream reported.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

from bench_cells import ROOT, BenchContext, baseline_checkout, edge_stack, epilogue
from bench_client import load_average, rss_mb

STREAMS = 1000
BATCH = 100  # connections opened at once
TIMEOUT_S = 90.0
TOP_TYPES = 24  # object types reported per stream with --diagnose
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


def _dumped(path: Path) -> dict[str, dict[str, int]] | None:
    if not path.exists():
        return None
    time.sleep(0.2)  # let the Edge finish writing it
    data: dict[str, dict[str, int]] = json.loads(path.read_text())
    return data


async def _objects(pid: int, dump: Path, n: int) -> dict[str, dict[str, int]]:
    """The Edge's objects by type (counts and own bytes): its ``n``-th SIGUSR2 dump."""
    path = Path(f"{dump}.{pid}.{n}")
    os.kill(pid, signal.SIGUSR2)
    for _ in range(200):  # the dump is written between two of the Edge's loop turns
        await asyncio.sleep(0.05)
        if (data := _dumped(path)) is not None:
            return data
    raise RuntimeError(f"the Edge wrote no object counts to {path}")


def _per_stream(before: dict[str, dict[str, int]], during: dict[str, dict[str, int]]) -> str:
    """The object types that grew most, per stream: ``type n x bytes``, largest first."""
    grown = {
        name: (
            during["counts"][name] - before["counts"].get(name, 0),
            size - before["bytes"].get(name, 0),
        )
        for name, size in during["bytes"].items()
    }
    total = sum(b for _, b in grown.values()) / STREAMS
    top = sorted(grown.items(), key=lambda kv: -kv[1][1])[:TOP_TYPES]
    listed = ", ".join(f"{name} {n / STREAMS:.1f} x {b / STREAMS:.0f} B" for name, (n, b) in top)
    return f"objects {total / 1024:.1f} KB per stream ({listed})"


async def _measure(ctx: BenchContext, name: str, root: Path, dump: Path | None) -> str:
    env = {"IOP_BENCH_OBJECTS": str(dump)} if dump else {}
    with edge_stack(ctx, name, env, capacity=STREAMS + 64, root=root) as target:
        edge, node = target.pids["edge"], target.pids["node"]
        load1 = load_average()
        await _leave(await _hold(target.port, target.token, BATCH))  # warm-up: imports, pools
        await asyncio.sleep(1.0)
        before = {name: rss_mb(pid)[0] for name, pid in (("edge", edge), ("node", node))}
        counted = await _objects(edge, dump, 1) if dump else None
        started = time.monotonic()
        writers = await _hold(target.port, target.token, STREAMS)
        opened = time.monotonic() - started
        await asyncio.sleep(1.0)  # what each open stream keeps, not what opening it took
        during = {name: rss_mb(pid)[0] for name, pid in (("edge", edge), ("node", node))}
        objects = _per_stream(counted, await _objects(edge, dump, 2)) if dump and counted else ""
        await _leave(writers)
    per = {k: (during[k] - before[k]) * 1024 / STREAMS for k in before}
    return (
        f"Open streams ({name}): {STREAMS} held at once (opened in {opened:.1f} s, load "
        f"{load1:.2f}): Edge RSS {before['edge']:.0f} -> {during['edge']:.0f} MB, "
        f"{per['edge']:.1f} KB per stream; Node {before['node']:.0f} -> {during['node']:.0f} MB, "
        f"{per['node']:.1f} KB per stream (target: Edge <= 16 KB)"
        + (f"; Edge {objects}" if objects else "")
    )


@epilogue
def streams_epilogue(ctx: BenchContext) -> str:
    """RSS per open stream on the Edge (and the Node), after the rounds; with ``--baseline``,
    the baseline's first."""
    if ctx.options.suite and "streams" not in ctx.options.suite:
        return ""
    runs = [("edge-streams", ROOT)]
    if getattr(ctx.options, "baseline", None):
        rev, root = baseline_checkout(ctx.options.baseline)
        runs.insert(0, (f"edge-streams@{rev}", root))
    lines = []
    for name, root in runs:
        dump = (
            Path(ctx.options.diagnose).resolve() / f"objects-{name}"
            if ctx.options.diagnose
            else None
        )
        try:
            measured = _measure(ctx, name, root, dump)
            lines.append(asyncio.run(asyncio.wait_for(measured, TIMEOUT_S)))
        except (OSError, RuntimeError, TimeoutError, AssertionError) as exc:
            lines.append(f"Open streams ({name}): not measured ({type(exc).__name__}: {exc})")
    return "\n\n".join(lines)
