"""Sustained rate at p99 under 20 ms (`make bench`, the peers suite after its rounds;
docs/performance.md).

An open-loop load, not wrk's closed loop: request *i* of a step is due at ``start + i / rate``
whatever the answers before it did, and its latency runs from that due time to the end of its
answer, so a gateway that falls behind is charged for the requests waiting on it (wrk's
``delay()`` only spaces each connection's next request after its answer, which lets a slow
server lower the load it is offered). The generator is one asyncio loop (uvloop when
installed) in bench.py's own process, on the load CPU with wrk and the upstream; requests go
over keep-alive connections, a new one opened when none is idle, at most ``CONNECTIONS``; one
the server closed while idle is dropped, and a request that meets such a close is sent once
more on a new connection, as an HTTP client does (Node.js and uvicorn close a connection idle
for 5 s; the Edge after 60 s).

Stepped rates per target: ``FIRST_RATE`` req/s, doubled while a step holds (p99 < 20 ms, every
answer a 200, none left when the step's drain time ran out), then ``REFINE`` bisections
between the last rate that held and the first that did not. The targets step in turn (one
step of each, then the next), so they share the machine's conditions. Bounded: at most
``MAX_STEPS`` steps per target of ``seconds`` each, ``DRAIN_S`` to finish a step.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bench_client import load_average, percentile

if TYPE_CHECKING:
    from bench_cells import Target

P99_LIMIT_MS = 20.0
FIRST_RATE = 100.0
MAX_RATE = 12800.0
REFINE = 3
MAX_STEPS = 12
CONNECTIONS = 256
DRAIN_S = 5.0
SETTLE_S = 0.5  # after a step that held
RECOVER_S = 5.0  # after one that did not: the backlog it left (a server may still work it off)


@dataclass(frozen=True)
class Step:
    rate: float  # offered, req/s
    sent: int
    latencies_ms: list[float]  # of the 200 answers, from each request's due time
    failed: int  # not a 200, a lost connection, or not answered within the drain time
    load1: float

    @property
    def p50(self) -> float:
        return percentile(self.latencies_ms, 50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies_ms, 99) if len(self.latencies_ms) == self.sent else 1e9

    @property
    def held(self) -> bool:
        return self.failed == 0 and self.p99 < P99_LIMIT_MS

    def as_dict(self) -> dict[str, float | int | None]:
        answered = len(self.latencies_ms) == self.sent
        return {
            "rate": self.rate, "sent": self.sent, "failed": self.failed, "load1": self.load1,
            "p50_ms": round(self.p50, 3), "p99_ms": round(self.p99, 3) if answered else None,
        }  # fmt: skip


@dataclass
class Search:
    """The rates one target is offered: doubling while they hold, then bisection."""

    steps: list[Step] = field(default_factory=list)

    def next_rate(self) -> float | None:
        if not self.steps:
            return FIRST_RATE
        if len(self.steps) >= MAX_STEPS:
            return None
        held = [s.rate for s in self.steps if s.held]
        failed = [s.rate for s in self.steps if not s.held]
        if not failed:
            return max(held) * 2 if max(held) * 2 <= MAX_RATE else None
        if not held:  # even the first rate failed: halve, down to a floor
            return min(failed) / 2 if min(failed) / 2 >= FIRST_RATE / 8 else None
        low, high = max(held), min(failed)
        first_failure = next(i for i, s in enumerate(self.steps) if not s.held)
        if len(self.steps) - first_failure - 1 >= REFINE or high - low < high * 0.05:
            return None
        return round((low + high) / 2)

    @property
    def sustained(self) -> float:
        return max((s.rate for s in self.steps if s.held), default=0.0)


def _complete(buffer: bytearray) -> int | None:
    """The status of a whole HTTP/1.1 response in ``buffer`` (None while it is arriving)."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buffer[:end]).lower()
    if b"transfer-encoding: chunked" in head:
        if not buffer.endswith(b"0\r\n\r\n"):
            return None
    else:
        length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
        if len(buffer) < end + 4 + length:
            return None
    return int(head.split(b" ", 2)[1])


class _Connection(asyncio.Protocol):
    """One keep-alive connection with at most one request outstanding."""

    def __init__(self) -> None:
        self.transport: asyncio.WriteTransport | None = None  # uvloop's is no asyncio.Transport
        self.buffer = bytearray()
        self.waiter: asyncio.Future[int] | None = None
        self.answered = 0  # responses read on this connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        status = _complete(self.buffer)
        if status is not None and self.waiter is not None and not self.waiter.done():
            self.buffer.clear()
            self.answered += 1
            self.waiter.set_result(status)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("closed"))

    async def send(self, request: bytes) -> int:
        if self.transport is None:
            raise ConnectionError("closed")
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class _Pool:
    def __init__(self, port: int) -> None:
        self.port, self.opened = port, 0
        self.idle: asyncio.Queue[_Connection] = asyncio.Queue()

    async def take(self) -> _Connection:
        """An idle connection the server has not closed (Node.js and uvicorn close one
        idle for 5 s), else a new one while fewer than ``CONNECTIONS`` are open."""
        while not self.idle.empty():
            conn = self.idle.get_nowait()
            if conn.transport is not None:
                return conn
            self.opened -= 1
        if self.opened < CONNECTIONS:
            return await self.fresh()
        return await self.idle.get()

    async def fresh(self) -> _Connection:
        self.opened += 1
        try:
            _, conn = await asyncio.get_running_loop().create_connection(
                _Connection, "127.0.0.1", self.port
            )
        except OSError:
            self.opened -= 1
            raise
        return conn

    def give(self, conn: _Connection, reusable: bool) -> None:
        if reusable and conn.transport is not None:
            self.idle.put_nowait(conn)
        else:
            conn.close()
            self.opened -= 1

    def close(self) -> None:
        while not self.idle.empty():
            self.idle.get_nowait().close()


async def _step(pool: _Pool, request: bytes, rate: float, seconds: float) -> Step:
    """``rate`` req/s for ``seconds``, open loop (perf_counter: uvloop's clock is in ms)."""
    load1 = load_average()
    latencies: list[float] = []
    failed = 0

    async def one(due: float) -> None:
        nonlocal failed
        conn: _Connection | None = None
        ok = False
        try:
            conn = await pool.take()
            try:
                status = await conn.send(request)
            except ConnectionError:
                if conn.answered == 0 or conn.buffer:  # not a kept-alive one closed while idle
                    raise
                pool.give(conn, reusable=False)  # as an HTTP client does: once, on a new one
                conn = None
                conn = await pool.fresh()
                status = await conn.send(request)
            ok = True
            if status == 200:
                latencies.append((time.perf_counter() - due) * 1000)
            else:
                failed += 1
        except (OSError, ConnectionError):
            failed += 1
        finally:
            if conn is not None:
                pool.give(conn, reusable=ok)

    sent = max(1, round(rate * seconds))
    start = time.perf_counter() + 0.01
    tasks = []
    for i in range(sent):
        due = start + i / rate
        if (wait := due - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.ensure_future(one(due)))
    _, pending = await asyncio.wait(tasks, timeout=DRAIN_S)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    failed += len(pending)
    step = Step(rate, sent, latencies, failed, load1)
    await asyncio.sleep(SETTLE_S if step.held else RECOVER_S)
    return step


async def _search(targets: list[Target], seconds: float) -> dict[str, Search]:
    searches = {t.name: Search() for t in targets}
    pools = {t.name: _Pool(t.port) for t in targets}
    requests = {t.name: t.probe("json").request for t in targets}
    try:
        while True:
            stepped = False
            for target in targets:
                search = searches[target.name]
                rate = search.next_rate()
                if rate is None:
                    continue
                step = await _step(pools[target.name], requests[target.name], rate, seconds)
                search.steps.append(step)
                stepped = True
                print(
                    f"[rate] {target.name:10} {rate:7.0f} req/s offered: p50 {step.p50:.2f} ms "
                    f"p99 {min(step.p99, 1e6):.2f} ms failed {step.failed} load {step.load1:.2f}",
                    flush=True,
                    file=sys.stderr,
                )
            if not stepped:
                return searches
    finally:
        for pool in pools.values():
            pool.close()


def sustained(targets: list[Target], seconds: float) -> dict[str, Search]:
    """Each target's stepped search (uvloop when installed, as the servers under test)."""
    runner: asyncio.Runner
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner as r:
        return r.run(_search(targets, seconds))


def render(searches: dict[str, Search]) -> list[str]:
    """The report's section: each target's steps and its sustained rate."""
    lines = [
        f"## Sustained rate at p99 < {P99_LIMIT_MS:g} ms (open loop, stepped, json)",
        "",
        "| target | sustained req/s | steps (offered req/s: p99 ms) | load |",
        "|---|---|---|---|",
    ]
    loads: list[float] = []
    for name, search in searches.items():
        loads += [s.load1 for s in search.steps]
        steps = ", ".join(
            f"{s.rate:.0f}: {s.p99:.1f}" if s.p99 < 1e9 else f"{s.rate:.0f}: {s.failed} unanswered"
            for s in search.steps
        )
        own = [s.load1 for s in search.steps]
        load = f"{min(own):.1f}-{max(own):.1f}" if own else "-"
        lines.append(f"| {name} | {search.sustained:.0f} | {steps} | {load} |")
    lines += [
        "",
        "Request i of a step is due at i/rate; its latency runs from that due time "
        "(scripts/bench_rate.py). Sustained: the highest offered rate whose p99 stayed "
        f"under {P99_LIMIT_MS:g} ms with every answer a 200"
        + (f"; median load of the steps {statistics.median(loads):.2f}." if loads else "."),
    ]
    return lines
