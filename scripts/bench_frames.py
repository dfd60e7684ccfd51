"""Added delay per streamed frame (`make bench`, the peers suite after its rounds;
docs/performance.md).

The upstream writes a stream of ``FRAME_EVENTS`` (1000) events back to back, one write each
(``bench-frames`` in scripts/bench_upstream.py). A client on one connection reads it and
stamps every event with the time of the read that completed it; the gaps between consecutive
events, through a gateway and straight from the upstream, give the delay the gateway adds to
each frame: median and p99 of the gaps (gateway minus direct), and the mean (the stream's
span over its gaps), which is what events arriving together in one read cannot hide.
``STREAMS`` streams per target per round, targets in turn; bounded by ``STREAM_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench_client import load_average, percentile, post_request
from bench_upstream import FRAME_EVENTS

if TYPE_CHECKING:
    from bench_cells import Target

STREAMS = 2  # per target per round
STREAM_TIMEOUT_S = 30.0
MARK = b"data:"


@dataclass
class Frames:
    """A target's streams: every gap between consecutive events (µs), each stream's mean."""

    gaps_us: list[float]
    means_us: list[float]
    loads: list[float]

    def figure(self, what: str) -> float:
        if what == "mean":
            return statistics.median(self.means_us)
        return percentile(self.gaps_us, 50 if what == "p50" else 99)


def _request(target: Target) -> bytes:
    body = {**target.bodies["stream"], "messages": [{"role": "user", "content": "bench-frames"}]}
    extra = (*target.headers, ("Connection", "close"))
    return post_request(
        "127.0.0.1", target.port, target.path, json.dumps(body).encode(), target.token, extra
    )


async def _one(target: Target) -> list[float]:
    """The arrival time of each event of one stream (s, perf_counter)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", target.port)
    try:
        writer.write(_request(target))
        status = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n", 1)[0]
        if b" 200 " not in status:
            raise RuntimeError(f"{target.name}: {status.decode()}")
        stamps: list[float] = []
        carry = b""  # the previous read's tail: a marker split across two reads counts once
        while len(stamps) < FRAME_EVENTS:
            data = await reader.read(65536)
            now = time.perf_counter()
            if not data:
                raise RuntimeError(f"{target.name}: {len(stamps)} of {FRAME_EVENTS} events")
            seen = (carry + data).count(MARK) - carry.count(MARK)
            stamps += [now] * seen
            carry = data[-(len(MARK) - 1) :]
        return stamps
    finally:
        writer.close()


async def _measure(targets: list[Target], rounds: int) -> dict[str, Frames]:
    out = {t.name: Frames([], [], []) for t in targets}
    for _ in range(rounds):
        for target in targets:
            for _ in range(STREAMS):
                load1 = load_average()
                stamps = await asyncio.wait_for(_one(target), STREAM_TIMEOUT_S)
                gaps = [(b - a) * 1e6 for a, b in itertools.pairwise(stamps)]
                out[target.name].gaps_us += gaps
                out[target.name].means_us.append(statistics.fmean(gaps))
                out[target.name].loads.append(load1)
    return out


def per_frame(targets: list[Target], rounds: int) -> dict[str, Frames]:
    """Every target's frames; the first target is the upstream, read directly."""
    return asyncio.run(_measure(targets, rounds))


def render(frames: dict[str, Frames], direct: str = "upstream") -> list[str]:
    lines = [
        f"## Added delay per streamed frame ({FRAME_EVENTS}-event stream written back to back)",
        "",
        "| target | gap p50 µs | gap p99 µs | mean gap µs | added p50 µs | added p99 µs "
        "| added mean µs | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base = frames.get(direct)
    for name, f in frames.items():
        added = [
            f"{f.figure(w) - base.figure(w):.1f}" if base and name != direct else "-"
            for w in ("p50", "p99", "mean")
        ]
        lines.append(
            f"| {name} | {f.figure('p50'):.1f} | {f.figure('p99'):.1f} | {f.figure('mean'):.1f} "
            f"| {' | '.join(added)} | {min(f.loads):.1f}-{max(f.loads):.1f} |"
        )
    lines += [
        "",
        f"{STREAMS} streams per target per round, targets in turn; an event's time is that of "
        "the read that completed it, so events arriving together have gaps of 0 "
        "(scripts/bench_frames.py). Added: the target's figure minus the upstream's.",
    ]
    return lines
