"""Figures and tables of `make bench`: one Row per (target, mode, concurrency) run."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from bench_client import WrkResult, percentile
from bench_upstream import EVENTS


@dataclass
class Row:
    target: str  # upstream | proxy | edge
    mode: str  # json | stream
    c: int
    wrk: WrkResult
    ttfb_s: list[float] = field(default_factory=list)
    cpu_ms: dict[str, float] = field(default_factory=dict)  # CPU per request, per process

    @property
    def rps(self) -> float:
        return self.wrk.rps

    @property
    def events_s(self) -> float:
        return self.rps * EVENTS if self.mode == "stream" else 0.0

    def ttfb_ms(self, q: float) -> float:
        return percentile(self.ttfb_s, q) * 1000

    def line(self) -> str:
        ttfb = f" ttfb p50 {self.ttfb_ms(50):.2f} ms" if self.ttfb_s else ""
        return (
            f"{self.mode:6} c={self.c:<3} {self.target:8} {self.rps:8.0f} req/s "
            f"p50 {self.wrk.p50_ms:.2f} ms p99 {self.wrk.p99_ms:.2f} ms{ttfb}"
            f" cpu/req {self.cpu_text()} errors {self.wrk.errors}"
        )

    def cpu_text(self) -> str:
        return " + ".join(f"{name} {ms:.2f}" for name, ms in self.cpu_ms.items())

    def as_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "mode": self.mode,
            "c": self.c,
            "rps": round(self.rps, 1),
            "p50_ms": self.wrk.p50_ms,
            "p99_ms": self.wrk.p99_ms,
            "errors": self.wrk.errors,
            "requests": self.wrk.requests,
            "events_s": round(self.events_s),
            "ttfb_p50_ms": round(self.ttfb_ms(50), 3),
            "ttfb_p99_ms": round(self.ttfb_ms(99), 3),
            "ttfb_samples": len(self.ttfb_s),
            "cpu_ms_per_request": {k: round(v, 3) for k, v in self.cpu_ms.items()},
        }


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _targets(by: dict[tuple[str, str, int], Row], memory: dict[str, tuple[float, ...]]) -> list:
    edge16, proxy16 = by[("edge", "json", 16)], by[("proxy", "json", 16)]
    added_p50 = by[("edge", "json", 1)].wrk.p50_ms - by[("upstream", "json", 1)].wrk.p50_ms
    added_ttfb = by[("edge", "stream", 1)].ttfb_ms(50) - by[("upstream", "stream", 1)].ttfb_ms(50)
    events = max(by[("edge", "stream", c)].events_s for c in (1, 16, 64))
    return [
        (
            "non-stream c=16 req/s vs the one-hop proxy",
            edge16.rps / proxy16.rps,
            ">= 0.75x",
            edge16.rps >= 0.75 * proxy16.rps,
            f"{edge16.rps / proxy16.rps:.3f}x",
        ),
        ("non-stream c=16 req/s", edge16.rps, ">= 900", edge16.rps >= 900, f"{edge16.rps:.0f}"),
        (
            "added p50 over the upstream, c=1",
            added_p50,
            "< 1.5 ms",
            added_p50 < 1.5,
            f"{added_p50:.2f} ms",
        ),
        (
            "stream first-byte overhead, c=1",
            added_ttfb,
            "< 1.5 ms",
            added_ttfb < 1.5,
            f"{added_ttfb:.2f} ms",
        ),
        ("relayed stream events/s (best c)", events, ">= 20000", events >= 20000, f"{events:.0f}"),
        (
            "Edge idle RSS",
            memory["edge"][0],
            "< 150 MB",
            memory["edge"][0] < 150,
            f"{memory['edge'][0]:.0f} MB",
        ),
    ]


def render(
    rows: list[Row], memory: dict[str, tuple[float, ...]], elapsed_s: float, rounds: int
) -> dict[str, Any]:
    """Markdown tables for people and a dict for --json."""
    by = {(r.target, r.mode, r.c): r for r in rows}
    out = [
        f"IOP Edge benchmark: loopback, {os.cpu_count()} CPUs, wrk -t1, best of {rounds} "
        f"runs of {rows[0].wrk.seconds:.0f} s, {EVENTS} events per stream, "
        f"{elapsed_s:.0f} s in all",
        "",
        "## Raw figures",
        "",
    ]
    out += _table(
        [
            "mode",
            "c",
            "target",
            "req/s",
            "p50 ms",
            "p99 ms",
            "TTFB p50 ms",
            "TTFB p99 ms",
            "events/s",
            "CPU ms/req",
            "errors",
        ],
        [
            [
                r.mode,
                str(r.c),
                r.target,
                f"{r.rps:.0f}",
                f"{r.wrk.p50_ms:.2f}",
                f"{r.wrk.p99_ms:.2f}",
                f"{r.ttfb_ms(50):.2f}" if r.ttfb_s else "-",
                f"{r.ttfb_ms(99):.2f}" if r.ttfb_s else "-",
                f"{r.events_s:.0f}" if r.mode == "stream" else "-",
                r.cpu_text(),
                str(r.wrk.errors),
            ]
            for r in rows
        ],
    )
    out += ["", "## Edge+Node against the baselines (ratio = Edge / baseline)", ""]
    ratio_rows = []
    for (target, mode, c), edge in by.items():
        if target != "edge":
            continue
        up, px = by[("upstream", mode, c)], by[("proxy", mode, c)]
        stream = mode == "stream"
        ratio_rows.append(
            [
                mode,
                str(c),
                _ratio(edge.rps, up.rps),
                _ratio(edge.rps, px.rps),
                _ratio(edge.wrk.p50_ms, up.wrk.p50_ms),
                _ratio(edge.wrk.p50_ms, px.wrk.p50_ms),
                f"{edge.wrk.p50_ms - up.wrk.p50_ms:+.2f}",
                _ratio(edge.ttfb_ms(50), up.ttfb_ms(50)) if stream else "-",
                _ratio(edge.ttfb_ms(50), px.ttfb_ms(50)) if stream else "-",
                f"{edge.ttfb_ms(50) - up.ttfb_ms(50):+.2f}" if stream else "-",
            ]
        )
    out += _table(
        [
            "mode",
            "c",
            "req/s ÷ upstream",
            "req/s ÷ proxy",
            "p50 ÷ upstream",
            "p50 ÷ proxy",
            "p50 added ms",
            "TTFB ÷ upstream",
            "TTFB ÷ proxy",
            "TTFB added ms",
        ],
        ratio_rows,
    )
    out += ["", "## Memory (RSS from /proc, MB)", ""]
    out += _table(
        ["process", "idle", "after the load", "peak"],
        [[name, *(f"{v:.0f}" for v in figures)] for name, figures in memory.items()],
    )
    targets = _targets(by, memory)
    out += ["", "## Targets (reported, not asserted)", ""]
    out += _table(
        ["what", "measured", "target", "met"],
        [[what, text, goal, "yes" if met else "NO"] for what, _, goal, met, text in targets],
    )
    data = {
        "rows": [r.as_dict() for r in rows],
        "memory_mb": memory,
        "targets": [{"what": w, "value": v, "target": g, "met": m} for w, v, g, m, _ in targets],
    }
    return {"text": "\n".join(out), "data": data}
