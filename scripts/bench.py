"""`make bench`: Edge+Node throughput, latency and stream relay against two baselines.

Everything on 127.0.0.1: a fast upstream (scripts/bench_upstream.py), the bare one-hop proxy
(scripts/bench_proxy.py: daphne + aiohttp) and a real Edge with a real Node
(tests.support.Stack). wrk drives throughput and latency; a raw asyncio probe times stream
first bytes. Non-stream and stream at concurrency 1, 16 and 64. Reports, never asserts.
See docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "scripts")) if p not in sys.path]

import bench_cells  # noqa: E402
from bench_cells import (  # noqa: E402
    BODIES,
    TRANSLATED_BODIES,
    TRANSLATED_EVENTS,
    BenchContext,
    Cell,
    Target,
    cpus_for_pinning,
    edge_stack,
    suite,
)
from bench_client import (  # noqa: E402
    StreamSample,
    cpu_seconds,
    load_average,
    probe_for,
    rss_mb,
    run_wrk,
    scrape,
)
from bench_report import Figures, LoopLag, Row, render  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.support import free_port  # noqa: E402

CONCURRENCY = (1, 16, 64)
LAG_HISTOGRAM = "iop_event_loop_lag_sample_seconds"
WRK_MISSING = """wrk is not installed. On Debian/Ubuntu:
    sudo apt-get update && sudo apt-get install -y wrk
then run `make bench` again."""


def _spawn(argv: list[str], first_line: str | None = None) -> tuple[subprocess.Popen[str], str]:
    """Start a helper and wait for its first stdout line (its port, or "ready")."""
    proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line or (first_line is not None and line != first_line):
        proc.kill()
        raise RuntimeError(f"{argv[0]} did not start")
    return proc, line


async def _check(target: Target) -> None:
    """One request of each kind must answer 200 with the whole stream, or nothing is measured."""
    for mode in BODIES:
        probe = target.probe(mode)
        try:
            sample = await probe.one()
        finally:
            await probe.close()
        expected = target.events if mode == "stream" else 0
        if sample.status != 200 or sample.events != expected:
            raise RuntimeError(
                f"{target.name} answered {mode} with status {sample.status} and "
                f"{sample.events} events (expected 200 and {expected})"
            )


def _lag_buckets(target: Target) -> dict[float, float]:
    """Cumulative counts of the Edge's loop-lag histogram, by upper bound."""
    if not target.metrics_url:
        return {}
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(scrape(target.metrics_url)):
        if family.name == LAG_HISTOGRAM:
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    buckets[float(sample.labels["le"])] = sample.value
    return buckets


def _lag_between(before: dict[float, float], after: dict[float, float]) -> LoopLag | None:
    if not after:
        return None
    counts = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = counts[float("inf")]
    within_5ms = max((n for le, n in counts.items() if le <= 0.005), default=0.0)
    worst = min((le for le, n in counts.items() if n >= total), default=0.0)
    return LoopLag(samples=int(total), over_5ms=int(total - within_5ms), worst_le=worst)


async def _measure(cell: Cell, seconds: float) -> Row:
    """wrk at the cell's concurrency; for streams, first-byte times from a probe (alone at
    c=1, else one extra connection beside wrk's c)."""
    target, mode, c = cell.target, cell.mode, cell.c
    samples: list[StreamSample] = []
    load1 = load_average()
    lag_before = _lag_buckets(target)
    cpu_before = {name: cpu_seconds(pid) for name, pid in target.pids.items()}
    if mode == "stream" and c == 1:
        samples = await probe_for(target.probe(mode), min(seconds, 2.0))
    wrk = asyncio.create_task(
        asyncio.to_thread(
            run_wrk,
            target.url,
            target.body(mode),
            target.token,
            c,
            seconds,
            target.spread,
            target.headers,
        )
    )
    if mode == "stream" and c > 1:
        await asyncio.sleep(min(0.5, seconds / 4))  # let wrk's connections get going
        samples = await probe_for(target.probe(mode), seconds / 2)
    result = await wrk
    served = max(1, result.requests + len(samples))
    cpu_ms = {
        name: (cpu_seconds(pid) - cpu_before[name]) * 1000 / served
        for name, pid in target.pids.items()
    }
    lag = _lag_between(lag_before, _lag_buckets(target))
    return Row(target.name, mode, c, result, [s.ttfb_s for s in samples], cpu_ms, load1, lag)


def _profile(pids: dict[str, int], seconds: float, out: Path, label: str) -> list[Any]:
    """py-spy (non-blocking) on the Edge and the Node for ``seconds``, collapsed stacks."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        print("--profile needs py-spy: .venv/bin/pip install py-spy", file=sys.stderr)
        return []
    out.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(int(seconds)),
                "--rate",
                "250",
                "--nonblocking",
                "--format",
                "raw",
                "-o",
                str(out / f"{name}-{label}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]


def _summarise_profiles(directory: Path) -> None:
    """Beside each py-spy file, its top tables (scripts/bench_profile.py) as ``*.top.txt``."""
    from bench_profile import summary

    for raw in sorted(directory.glob("*.txt")):
        if not raw.name.endswith(".top.txt") and raw.stat().st_size:
            raw.with_suffix(".top.txt").write_text(summary(raw, 25) + "\n")
    print(f"profiles and their top tables: {directory}", file=sys.stderr)


async def _run(
    cells: list[Cell], args: argparse.Namespace
) -> dict[tuple[str, str, int], list[Row]]:
    targets = {cell.target.name: cell.target for cell in cells}
    for target in targets.values():
        await _check(target)
        await asyncio.to_thread(
            run_wrk,
            target.url,
            target.body("json"),
            target.token,
            16,
            1,
            target.spread,
            target.headers,
        )  # warm-up: connections, caches
    runs: dict[tuple[str, str, int], list[Row]] = {cell.key: [] for cell in cells}
    for turn in range(args.rounds):  # every cell once per round: they share the conditions
        for cell in cells:
            spies = []
            if args.profile and cell.target.name == "edge" and cell.c <= 16 and turn == 0:
                label = f"{cell.mode}-c{cell.c}"
                spies = _profile(cell.target.pids, args.seconds, Path(args.profile), label)
            row = await _measure(cell, args.seconds)
            for spy in spies:
                spy.wait(timeout=30)
            print(f"[{turn + 1}/{args.rounds}] {row.line()}", file=sys.stderr, flush=True)
            runs[cell.key].append(row)
    return runs


@suite("core")
def core_suite(ctx: BenchContext) -> Iterator[list[Cell]]:
    """The upstream alone, the one-hop proxy and Edge+Node, json and stream, c = 1, 16, 64."""
    proxy_port = free_port()
    proxy, _ = _spawn(
        ["scripts/bench_proxy.py", "--port", str(proxy_port),
         "--upstream", f"http://127.0.0.1:{ctx.upstream_port}"],
        first_line="ready",
    )  # fmt: skip
    try:
        ctx.pin("proxy", proxy.pid, server=True)
        with edge_stack(ctx, "edge") as edge:
            targets = [
                Target("upstream", ctx.upstream_port, {"upstream": ctx.upstream_pid}),
                Target("proxy", proxy_port, {"proxy": proxy.pid}),
                edge,
            ]
            if ctx.options.translated:  # the same Edge, asked by an Anthropic client
                targets.append(
                    dataclasses.replace(
                        edge, name="edge-translated", path="/v1/messages",
                        bodies=TRANSLATED_BODIES, events=TRANSLATED_EVENTS,
                    )
                )  # fmt: skip
            levels = ctx.options.concurrency or CONCURRENCY
            yield [Cell(t, mode, c) for mode in BODIES for c in levels for t in targets]
    finally:
        proxy.terminate()
        proxy.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per cell (at least 3)")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", help=f"core cells at these only ({CONCURRENCY})"
    )
    parser.add_argument(
        "--suite",
        action="append",
        help="only these suites (repeatable); 'limits' names the per-token cell, 'managed' "
        "the managed-mode cell",
    )
    parser.add_argument(
        "--translated",
        action="store_true",
        help="also measure the Edge answering an Anthropic client by translation",
    )
    parser.add_argument(
        "--redis", help="Redis of the scale cells (default IOP_TEST_REDIS_URL, else local 6379)"
    )
    parser.add_argument(
        "--postgres",
        help="PostgreSQL of the scale cells, a database is made per cluster and dropped "
        "(default IOP_TEST_DATABASE_URL, else postgres@127.0.0.1:5432)",
    )
    parser.add_argument("--no-pin", action="store_true", help="leave CPU placement to the OS")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        nargs="?",
        const=str(ROOT / "var" / "bench" / "profile"),
        help="py-spy the Edge and the Node in the first c=1 and c=16 runs, into DIR "
        "(default var/bench/profile)",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also LiteLLM's proxy beside Portkey's gateway (installed once, large)",
    )
    parser.add_argument(
        "--diagnose",
        metavar="DIR",
        help="time every collector pass of the Edges and Nodes into DIR",
    )
    parser.add_argument(
        "--variant", action="append", choices=sorted(bench_cells.VARIANTS),
        help="also run an Edge+Node with this fix undone, side by side "
        "(docs/performance-history.md)",
    )  # fmt: skip
    parser.add_argument(
        "--baseline", metavar="REV",
        help="also run the Edge+Node of git revision REV (a worktree under var/bench/baseline), "
        "as edge@REV and edge-1core@REV, in the same rounds: what a change bought",
    )  # fmt: skip
    args = parser.parse_args()
    args.rounds = max(3, args.rounds)
    if shutil.which("wrk") is None:
        print(WRK_MISSING, file=sys.stderr)
        return 2
    for name in bench_cells.SUITE_MODULES:
        importlib.import_module(name)
    chosen = [name for name in args.suite or bench_cells.SUITES if name in bench_cells.SUITES]
    started = time.monotonic()
    all_cpus = os.sched_getaffinity(0)
    cpus = None if args.no_pin else cpus_for_pinning()
    if cpus is not None:
        bench_cells.pin_process(os.getpid(), {cpus[1]})  # wrk, the probe and the upstream
    upstream, port = _spawn(["scripts/bench_upstream.py"])
    try:
        with (
            tempfile.TemporaryDirectory(prefix="iop-bench-") as directory,
            contextlib.ExitStack() as suites,
        ):
            ctx = BenchContext(int(port), upstream.pid, Path(directory), args, all_cpus=all_cpus)
            if cpus is not None:
                ctx.server_cpu, ctx.peer_cpu = cpus
                ctx.pinned["upstream"] = ctx.pinned["wrk and probe"] = cpus[1]
            cells = [
                c for name in chosen for c in suites.enter_context(bench_cells.SUITES[name](ctx))
            ]
            idle = {name: rss_mb(pid)[0] for name, pid in ctx.memory_pids.items()}
            runs = asyncio.run(_run(cells, args))
            if args.profile:
                _summarise_profiles(Path(args.profile))
            memory = {name: (idle[name], *rss_mb(pid)) for name, pid in ctx.memory_pids.items()}
        epilogues = [text for fn in bench_cells.EPILOGUES if (text := fn(ctx))]
    finally:
        upstream.terminate()
        upstream.wait(10)
    pinning = (
        ", ".join(f"{name} on CPU {cpu}" for name, cpu in ctx.pinned.items())
        if ctx.pinned
        else "none (fewer than 2 CPUs, or --no-pin)"
    )
    header = {
        "rounds": args.rounds,
        "seconds": args.seconds,
        "pinning": pinning,
        "elapsed_s": time.monotonic() - started,
    }
    report = render(Figures(runs), memory, header)
    report["data"].update(bench_cells.MEASURED)
    print("\n\n".join([report["text"], *epilogues]))
    if args.json:
        Path(args.json).write_text(json.dumps(report["data"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
