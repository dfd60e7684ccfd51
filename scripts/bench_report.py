"""Figures and tables of `make bench`: one Row per run of a cell, medians and spread per cell."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bench_cells import CHECKS, SECTIONS, check
from bench_client import WrkResult, percentile
from bench_upstream import EVENTS

Key = tuple[str, str, int]  # (target, mode, concurrency)
EDGE_CPU_MS, NODE_CPU_MS = 0.15, 0.10  # CPU per json request at c=16 (docs/performance.md)


@dataclass(frozen=True)
class LoopLag:
    """What an Edge's loop-lag histogram counted during one run (docs/status.md)."""

    samples: int
    over_5ms: int
    worst_le: float  # upper bound of the highest bucket that counted a sample (s)


@dataclass
class Row:
    target: str
    mode: str  # json | stream
    c: int
    wrk: WrkResult
    ttfb_s: list[float] = field(default_factory=list)
    cpu_ms: dict[str, float] = field(default_factory=dict)  # CPU per request, per process
    load1: float = 0.0  # the machine's 1-minute load average when the run started
    lag: LoopLag | None = None

    @property
    def rps(self) -> float:
        return self.wrk.rps

    def ttfb_ms(self, q: float) -> float:
        return percentile(self.ttfb_s, q) * 1000

    def line(self) -> str:
        ttfb = f" ttfb p50 {self.ttfb_ms(50):.2f} ms" if self.ttfb_s else ""
        cpu = " + ".join(f"{name} {ms:.2f}" for name, ms in self.cpu_ms.items())
        return (
            f"{self.mode:6} c={self.c:<3} {self.target:10} {self.rps:8.0f} req/s "
            f"p50 {self.wrk.p50_ms:.2f} ms p99 {self.wrk.p99_ms:.2f} ms{ttfb}"
            f" cpu/req {cpu} errors {self.wrk.errors} load {self.load1:.2f}"
        )

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
            "ttfb_p50_ms": round(self.ttfb_ms(50), 3),
            "ttfb_p99_ms": round(self.ttfb_ms(99), 3),
            "ttfb_samples": len(self.ttfb_s),
            "cpu_ms_per_request": {k: round(v, 3) for k, v in self.cpu_ms.items()},
            "load1": self.load1,
            "loop_lag": self.lag.__dict__ if self.lag else None,
        }


Metric = Callable[[Row], float]
METRICS: dict[str, Metric] = {
    "rps": lambda r: r.rps,
    "p50": lambda r: r.wrk.p50_ms,
    "p99": lambda r: r.wrk.p99_ms,
    "ttfb50": lambda r: r.ttfb_ms(50),
    "ttfb99": lambda r: r.ttfb_ms(99),
    "load1": lambda r: r.load1,
}


class Figures:
    """The runs of every cell; medians and spread across them."""

    def __init__(self, runs: dict[Key, list[Row]]) -> None:
        self.runs = runs

    def has(self, key: Key) -> bool:
        return bool(self.runs.get(key))

    def values(self, key: Key, metric: str | Metric) -> list[float]:
        fn = METRICS[metric] if isinstance(metric, str) else metric
        return [fn(row) for row in self.runs[key]]

    def median(self, key: Key, metric: str | Metric) -> float:
        return statistics.median(self.values(key, metric))

    def cpu(self, key: Key, process: str) -> float:
        return self.median(key, lambda r: r.cpu_ms.get(process, 0.0))

    def cell(self, key: Key, metric: str, digits: int = 2) -> str:
        """``median [min-max]``."""
        values = self.values(key, metric)
        m = statistics.median(values)
        return f"{m:.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"

    def spread(self, key: Key, metric: str = "rps") -> float:
        """(max - min) / median across the runs of one cell."""
        values = self.values(key, metric)
        m = statistics.median(values)
        return (max(values) - min(values)) / m if m else 0.0


@dataclass(frozen=True)
class Check:
    what: str
    measured: str
    goal: str
    met: bool


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


@check
def core_checks(f: Figures) -> list[Check]:
    """The targets of docs/performance.md, on medians (Edge+Node against the baselines)."""
    out: list[Check] = []
    for mode in ("json", "stream"):
        key = ("edge", mode, 1)
        if f.has(key):
            ratio = f.median(key, "p99") / f.median(key, "p50")
            out.append(
                Check(f"{mode} c=1 p99 within 5x its p50", f"{ratio:.1f}x", "<= 5x", ratio <= 5)
            )
    if f.has(("edge", "json", 1)) and f.has(("upstream", "json", 1)):
        added = f.median(("edge", "json", 1), "p50") - f.median(("upstream", "json", 1), "p50")
        out.append(
            Check(
                "added p50 over the upstream, json c=1",
                f"{added:.2f} ms",
                "<= 1.3 ms",
                added <= 1.3,
            )
        )
    if f.has(("edge", "stream", 1)) and f.has(("upstream", "stream", 1)):
        added = f.median(("edge", "stream", 1), "ttfb50") - f.median(
            ("upstream", "stream", 1), "ttfb50"
        )
        out.append(
            Check("stream first-byte overhead, c=1", f"{added:.2f} ms", "<= 1.5 ms", added <= 1.5)
        )
    if f.has(("edge", "json", 16)) and f.has(("proxy", "json", 16)):
        edge, proxy = f.median(("edge", "json", 16), "rps"), f.median(("proxy", "json", 16), "rps")
        out.append(
            Check(
                "json c=16 req/s vs the one-hop proxy",
                f"{edge / proxy:.2f}x ({edge:.0f} vs {proxy:.0f})",
                ">= 0.75x",
                edge >= 0.75 * proxy,
            )
        )
        cpu = f.cpu(("edge", "json", 16), "edge")
        node = f.cpu(("edge", "json", 16), "node")
        out.append(
            Check(
                "Edge (Node) CPU per json request, c=16",
                f"{cpu:.2f} ms (Node {node:.2f} ms)",
                f"<= {EDGE_CPU_MS:.2f} ms (Node <= {NODE_CPU_MS:.2f} ms)",
                cpu <= EDGE_CPU_MS and node <= NODE_CPU_MS,
            )
        )
    return out


def _cells_table(f: Figures) -> list[str]:
    rows = []
    for (target, mode, c), runs in f.runs.items():
        key = (target, mode, c)
        stream = bool(runs[0].ttfb_s)
        cpu = " + ".join(f"{name} {f.cpu(key, name):.2f}" for name in runs[0].cpu_ms)
        ratio = f.median(key, "p99") / f.median(key, "p50") if f.median(key, "p50") else 0.0
        rows.append(
            [
                mode,
                str(c),
                target,
                f.cell(key, "rps", 0),
                f.cell(key, "p50"),
                f.cell(key, "p99"),
                f"{ratio:.1f}x",
                f.cell(key, "ttfb50") if stream else "-",
                f.cell(key, "ttfb99") if stream else "-",
                cpu,
                str(sum(r.wrk.errors for r in runs)),
                f.cell(key, "load1"),
            ]
        )
    head = [
        "mode",
        "c",
        "target",
        "req/s",
        "p50 ms",
        "p99 ms",
        "p99/p50",
        "TTFB p50 ms",
        "TTFB p99 ms",
        "CPU ms/req",
        "errors",
        "load1",
    ]
    return _table(head, rows)


def _ratios_table(f: Figures) -> list[str]:
    rows = []
    for target, mode, c in f.runs:
        up, px = ("upstream", mode, c), ("proxy", mode, c)
        if target != "edge" or not (f.has(up) and f.has(px)):
            continue
        edge = (target, mode, c)
        stream = mode == "stream"
        med = f.median
        rows.append(
            [
                mode,
                str(c),
                f"{med(edge, 'rps') / med(px, 'rps'):.2f}x",
                f"{med(edge, 'p50') / med(px, 'p50'):.2f}x",
                f"{med(edge, 'p50') - med(up, 'p50'):+.2f}",
                f"{med(edge, 'ttfb50') - med(up, 'ttfb50'):+.2f}" if stream else "-",
            ]
        )
    head = ["mode", "c", "req/s ÷ proxy", "p50 ÷ proxy", "p50 added ms", "TTFB added ms"]
    return _table(head, rows)


def _noise(f: Figures) -> list[str]:
    by_target: dict[str, list[float]] = {}
    for key in f.runs:
        by_target.setdefault(key[0], []).append(f.spread(key))
    loads = [r.load1 for runs in f.runs.values() for r in runs]
    if not loads:
        return ["(no cell ran)"]
    lines = [
        f"1-minute load average over the runs: median {statistics.median(loads):.2f}, "
        f"min {min(loads):.2f}, max {max(loads):.2f} ({os.cpu_count()} CPUs).",
        "Spread of req/s between the runs of one cell, (max - min) / median, median over "
        "the cells of each target:",
        "",
    ]
    lines += [
        f"- {t}: {statistics.median(s) * 100:.0f}% (worst cell {max(s) * 100:.0f}%)"
        for t, s in by_target.items()
    ]
    if "upstream" in by_target:
        lines += [
            "",
            "The upstream-direct cells have none of this project's code in the path: "
            "their spread is the machine's own noise.",
        ]
    return lines


def _lag_table(f: Figures) -> list[str]:
    rows = []
    for key, runs in f.runs.items():
        lags = [r.lag for r in runs if r.lag is not None]
        if lags:
            rows.append(
                [
                    key[1],
                    str(key[2]),
                    key[0],
                    str(sum(lag.samples for lag in lags)),
                    str(sum(lag.over_5ms for lag in lags)),
                    f"<= {max(lag.worst_le for lag in lags) * 1000:g} ms",
                ]
            )
    head = ["mode", "c", "target", "samples", "late by > 5 ms", "worst"]
    return _table(head, rows) if rows else ["(no target exposes the loop-lag histogram)"]


def render(
    f: Figures, memory: Mapping[str, tuple[float, ...]], header: dict[str, Any]
) -> dict[str, Any]:
    """Markdown tables for people and a dict for --json."""
    out = [
        f"IOP Edge benchmark: loopback, {os.cpu_count()} CPUs, wrk -t1, {header['rounds']} "
        f"rounds of {header['seconds']:g} s per cell, cells interleaved, {EVENTS} events per "
        f"stream, {header['elapsed_s']:.0f} s in all",
        f"Pinning: {header['pinning']}",
        "",
        "## Cells: median [min-max] of the runs",
        "",
        *_cells_table(f),
        "",
        "## Noise",
        "",
        *_noise(f),
        "",
        "## Edge+Node against the baselines (medians)",
        "",
        *_ratios_table(f),
        "",
        "## Edge event loop: how late its timer ran (docs/metering.md), all runs of a cell",
        "",
        *_lag_table(f),
        "",
        "## Memory (RSS from /proc, MB)",
        "",
    ]
    out += _table(
        ["process", "idle", "after the load", "peak"],
        [[name, *(f"{v:.0f}" for v in figures)] for name, figures in memory.items()],
    )
    for fn in SECTIONS:
        out += ["", *fn(f)]
    checks = [c for fn in CHECKS for c in fn(f)]
    out += ["", "## Targets on medians (reported, not asserted)", ""]
    out += _table(
        ["what", "measured", "target", "met"],
        [[c.what, c.measured, c.goal, "yes" if c.met else "NO"] for c in checks],
    )
    data = {
        **header,
        "runs": [r.as_dict() for runs in f.runs.values() for r in runs],
        "memory_mb": memory,
        "targets": [c.__dict__ for c in checks],
    }
    return {"text": "\n".join(out), "data": data}
