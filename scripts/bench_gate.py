"""The Stream Evidence Gate's cost, by measurement (docs/performance-history.md, "Stream
Evidence Gate").

In `make bench` (the ``gate`` suite): a second Edge+Node like the plain one with the gate on,
streamed cells at c=1 and c=16 beside the plain Edge's, and a section comparing them.

Run alone (``python scripts/bench_gate.py``):

1. ``GatedChat`` alone: microseconds per upstream event of `make bench`'s 20-event chat stream.
2. The Edge's own request path, in process (``OpenAIApp`` with a scripted Node on the real pool
   and hub): a streamed chat request with the gate off, the same with the gate on, and with
   ``--baseline DIR`` the gate-off figure from another checkout (e.g.
   ``git archive main | tar -x -C DIR``; ``--control`` a second copy of it, for the A/A noise
   floor), each in a subprocess, alternating round by round.
   Per request: the whole request, and the time to the first content byte the client gets.

Bounded: ``--rounds`` (default 5) of ``--requests`` (default 300) each; medians reported.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "scripts")) if p not in sys.path]

from bench_cells import BenchContext, Cell, edge_stack, section, suite  # noqa: E402
from bench_report import Figures  # noqa: E402
from bench_translate import TOKEN, _document, chat_stream  # noqa: E402
from bench_upstream import EVENTS  # noqa: E402

HOLD = 500  # the documented default window
NAME = "edge-gate"
CONCURRENCY = (1, 16)
GATE = {"enabled": True, "filters": [{"type": "repeat_guard", "hold_evidence_runes": HOLD}]}


@suite("gate")
def gate_suite(ctx: BenchContext) -> Iterator[list[Cell]]:
    """A second Edge+Node like the plain one, with the gate on (streams only: it gates those)."""
    with edge_stack(ctx, NAME, openai={"stream_evidence_gate": GATE}) as plain_target:
        # The answer (~110 runes) is shorter than the window: its content leaves as one
        # chunk at the end, so the client gets role, content, finish and [DONE].
        target = dataclasses.replace(plain_target, events=4)
        levels = [c for c in ctx.options.concurrency or CONCURRENCY if c in CONCURRENCY]
        yield [Cell(target, "stream", c) for c in levels]


@section
def compare(f: Figures) -> list[str]:
    """The gate on against the plain Edge, per streamed cell (medians)."""
    lines = [
        f"## Stream Evidence Gate on (H={HOLD}) against off (medians)",
        "",
        "TTFB is the role chunk's; the content of this short answer leaves at its end.",
        "",
        "| c | req/s off | req/s on | p50 added ms | TTFB added ms | Edge CPU ms/req off | on |",
        "|---|---|---|---|---|---|---|",
    ]
    for target, mode, c in f.runs:
        on, off = (target, mode, c), ("edge", mode, c)
        if target != NAME or not f.has(off):
            continue
        lines.append(
            f"| {c} | {f.median(off, 'rps'):.0f} | {f.median(on, 'rps'):.0f} | "
            f"{f.median(on, 'p50') - f.median(off, 'p50'):+.2f} | "
            f"{f.median(on, 'ttfb50') - f.median(off, 'ttfb50'):+.2f} | "
            f"{f.cpu(off, 'edge'):.2f} | {f.cpu(on, 'edge'):.2f} |"
        )
    return lines


def gated_chat_us(rounds: int, repeat: int = 200) -> float:
    from pool.gate import FilterPipeline, FilterSpec
    from pool.gate.chat_stream import GatedChat

    stream = chat_stream()
    results = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(repeat):
            gate = GatedChat(FilterPipeline([FilterSpec("repeat_guard", HOLD)]), "bench")
            for event in stream:
                gate.feed(event)
            gate.end()
        results.append((time.perf_counter() - started) / (repeat * len(stream)) * 1e6)
    return statistics.median(results)


async def _app_rounds(rounds: int, count: int, gate: bool) -> tuple[float, float]:
    """(us per request, us to the first content byte), medians over ``rounds``."""
    sys.path.insert(0, str(Path.cwd()))  # the measured tree's modules, not this script's
    from pool.http.app import OpenAIApp
    from tests.support.inprocess import Call, FakeNode, Runtime

    stream = chat_stream()

    async def answer(node: Any, run: Any) -> None:
        for event in stream:
            await node.emit(run.run_id, event)
        await node.end(run.run_id)

    document = _document()
    if gate:
        document["openai"]["stream_evidence_gate"] = {
            "enabled": True,
            "filters": [{"type": "repeat_guard", "hold_evidence_runes": HOLD}],
        }
    runtime = Runtime(document)
    node = await FakeNode(runtime.hub).start()
    node.script = answer
    app = OpenAIApp(runtime)
    body = {"model": "plain", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    path = "/v1/chat/completions"
    import pool.http.app as module

    print(module.__file__, file=sys.stderr)  # the parent checks which tree was measured

    def first_content(call: Call) -> bool:
        return any(b'"content":"tok' in m.get("body", b"") for m in call.sent)

    for _ in range(min(count, 50)):  # warm-up: imports, caches, the first allocations
        await Call(app, "POST", path, body, token=TOKEN).done()
    whole, ttfb = [], []
    for _ in range(rounds):  # medians per request: a pause of another process hits a few only
        firsts, totals = [], []
        for _ in range(count):
            began = time.perf_counter()
            call = Call(app, "POST", path, body, token=TOKEN)
            await call.wait_for(lambda c=call: first_content(c))  # type: ignore[misc]
            firsts.append(time.perf_counter() - began)
            await call.done()
            totals.append(time.perf_counter() - began)
            assert call.status == 200, call.sent
        whole.append(statistics.median(totals) * 1e6)
        ttfb.append(statistics.median(firsts) * 1e6)
    await runtime.hub.aclose()
    return statistics.median(whole), statistics.median(ttfb)


def app_figure(rounds: int, count: int, gate: bool, tree: Path) -> tuple[float, float]:
    """One (per request, first content) pair in a subprocess whose imports come from ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree), "DJANGO_SETTINGS_MODULE": "iop_site.settings"}
    args = [sys.executable, str(Path(__file__).resolve()), "--app-only"]
    args += ["--rounds", str(rounds), "--requests", str(count)] + (["--gate"] if gate else [])
    out = subprocess.run(
        args, cwd=tree, env=env, check=True, capture_output=True, text=True, timeout=600
    )
    measured = Path(out.stderr.strip().splitlines()[-1]).resolve()
    if not measured.is_relative_to(tree.resolve()):
        raise SystemExit(f"measured {measured}, not a module of {tree}")
    whole, first = out.stdout.strip().splitlines()[-1].split()
    return float(whole), float(first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--baseline", type=Path, help="another checkout for the before figure")
    parser.add_argument(
        "--control", type=Path, help="a second copy of the baseline: an A/A noise floor"
    )
    parser.add_argument("--app-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.app_only:
        whole, first = asyncio.run(_app_rounds(args.rounds, args.requests, args.gate))
        print(whole, first)
        return
    figures = {f"GatedChat, H={HOLD}, chat stream (us/event)": gated_chat_us(args.rounds)}
    runs: dict[str, list[tuple[float, float]]] = {
        "off": [],
        "on": [],
        "baseline": [],
        "control": [],
    }
    for turn in range(args.rounds):  # alternate, and swap the order every other round
        cells: list[tuple[str, Path, bool]] = [("off", ROOT, False), ("on", ROOT, True)]
        if args.baseline:
            cells.append(("baseline", args.baseline, False))
        if args.control:
            cells.append(("control", args.control, False))
        for name, tree, gate in cells if turn % 2 == 0 else cells[::-1]:
            runs[name].append(app_figure(1, args.requests, gate, tree))
    labels = {
        "off": "gate off",
        "on": f"gate on (H={HOLD})",
        "baseline": f"baseline {args.baseline}",
        "control": f"control (A/A) {args.control}",
    }
    for name, pairs in runs.items():
        if not pairs:
            continue
        figures[f"edge in process, chat stream {EVENTS} events, {labels[name]} (us/request)"] = (
            statistics.median(p[0] for p in pairs)
        )
        figures[f"  first content byte, {labels[name]} (us)"] = statistics.median(
            p[1] for p in pairs
        )
    load = os.getloadavg()
    print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for label, value in figures.items():
        print(f"{value:10.2f}  {label}")
    if args.json:
        args.json.write_text(json.dumps({"load": load, "figures": figures}, indent=2))


if __name__ == "__main__":
    main()
