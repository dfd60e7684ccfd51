"""`make bench` cell: what tracing costs the Edge per request (R-OBS-2).

Three Edge+Node stacks on one upstream: two with no ``OTEL_*`` (``off`` and ``off-a/a``, an
A/A pair whose difference is the noise floor of the invocation) and one exporting every
request (``on``: ``parentbased_traceidratio`` 1.0) to an OTLP/HTTP sink in this process.
wrk runs non-stream chat at c=16 against each in turn, the order rotating per round; the
Edge's CPU per request is read from /proc. Reports, never asserts (docs/performance-history.md,
"Tracing").

Alone: ``.venv/bin/python scripts/bench_tracing.py [--seconds 3 --rounds 5]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "scripts")) if p not in sys.path]

from bench_cells import BenchContext, epilogue, run_alone  # noqa: E402
from bench_client import cpu_seconds, run_wrk  # noqa: E402

from tests.support import Stack  # noqa: E402
from tests.support.otlp import OtlpReceiver  # noqa: E402

CONCURRENCY = 16
BODY = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "ping"}]}).encode()
STACKS = ("off", "off-a/a", "on")


def _env(name: str, endpoint: str) -> dict[str, str]:
    if name != "on":
        return {}
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "1.0",
    }


def measure(upstream_port: int, seconds: float, rounds: int) -> dict[str, Any]:
    """Median Edge CPU per request and requests/s of each stack over interleaved wrk runs."""
    load_before = os.getloadavg()
    sink = OtlpReceiver("sink")
    cpu_ms: dict[str, list[float]] = {name: [] for name in STACKS}
    rps: dict[str, list[float]] = {name: [] for name in STACKS}
    errors = dict.fromkeys(STACKS, 0)
    try:
        with tempfile.TemporaryDirectory(prefix="iop-bench-tracing-") as directory, \
                contextlib.ExitStack() as running:  # fmt: skip
            stacks = {
                name: running.enter_context(
                    Stack(
                        Path(directory) / name.replace("/", "-"),
                        upstreams={},
                        providers=[{"id": "p-bench", "profile": "openai", "capacity": 256,
                                    "base_url": f"http://127.0.0.1:{upstream_port}/v1"}],
                        models=[{"id": "bench", "providers": {"p-bench": "bench-served"}}],
                        pool={"max_queue": 1024},
                        env=_env(name, sink.endpoint),
                        log_level="WARNING",
                    )
                )
                for name in STACKS
            }  # fmt: skip
            for stack in stacks.values():  # warm-up: connections, caches
                run_wrk(stack.v1_url + "/chat/completions", BODY, stack.token, CONCURRENCY, 1)
            for turn in range(rounds):
                for name in STACKS[turn % 3 :] + STACKS[: turn % 3]:
                    stack = stacks[name]
                    assert stack.edge is not None and stack.edge.popen is not None
                    pid = stack.edge.popen.pid
                    before = cpu_seconds(pid)
                    url = stack.v1_url + "/chat/completions"
                    result = run_wrk(url, BODY, stack.token, CONCURRENCY, seconds)
                    cpu = (cpu_seconds(pid) - before) * 1000 / max(1, result.requests)
                    cpu_ms[name].append(cpu)
                    rps[name].append(result.rps)
                    errors[name] += result.errors
                    print(f"tracing {name:8} c={CONCURRENCY} {result.rps:8.0f} req/s "
                          f"edge CPU {cpu:.3f} ms/req errors {result.errors}",
                          file=sys.stderr, flush=True)  # fmt: skip
            for stack in stacks.values():
                stack.wait_idle()
        door = door_cost_us(sink.endpoint)
    finally:
        sink.stop()
    cpu = {name: statistics.median(found) for name, found in cpu_ms.items()}
    return {
        "concurrency": CONCURRENCY,
        "rounds": rounds,
        "seconds": seconds,
        "edge_cpu_ms": {name: round(value, 4) for name, value in cpu.items()},
        "edge_cpu_ms_runs": {name: [round(v, 4) for v in found] for name, found in cpu_ms.items()},
        "median_rps": {name: round(statistics.median(found), 1) for name, found in rps.items()},
        "errors": errors,
        "cost_pct": round(100 * (cpu["on"] / cpu["off"] - 1), 1),
        "noise_pct": round(100 * (cpu["off-a/a"] / cpu["off"] - 1), 1),
        "exports": sink.posts,
        "door_us": door,
        "load_before": [round(v, 2) for v in load_before],
        "load_after": [round(v, 2) for v in os.getloadavg()],
    }


def door_cost_us(endpoint: str, iterations: int = 10_000) -> dict[str, float]:
    """In-process cost of what the door adds to one request (``pool.http.observe``: begin,
    the wrapped sends, one admission, the run ids, finish), in microseconds of this
    process's CPU (the exporter's thread included) over a bare pair of sends, the least of
    seven runs: with tracing off, and on with every request sampled and exported."""
    import asyncio
    import time

    from obskit.otel import start_tracing
    from pool.http import observe

    headers = {b"authorization": b"Bearer x", b"content-type": b"application/json"}
    start = {"type": "http.response.start", "status": 200, "headers": []}
    body = {"type": "http.response.body", "body": b"{}"}

    async def send(message: dict[str, Any]) -> None:
        return None

    async def bare() -> float:
        began = time.process_time()
        for _ in range(iterations):
            await send({**start})
            await send(body)
        return time.process_time() - began

    async def door(tracing: Any) -> float:
        began = time.process_time()
        for _ in range(iterations):
            obs = observe.begin(headers, tracing, "chat_completions")
            observed = observe.answering(send, obs)
            with observe.admission():
                pass
            observe.run_ids()
            await observed({**start})
            await observed(body)
            observe.finish(
                obs,
                None,
                operation="chat_completions",
                request_model="bench",
                response_model="bench-served",
                input_tokens=10,
                output_tokens=20,
                provider="p-bench",
                node="node-1",
                principal="bench",
                status=200,
            )
        return time.process_time() - began

    base = min(asyncio.run(bare()) for _ in range(7))
    off = min(asyncio.run(door(None)) for _ in range(7))
    tracing = start_tracing("iop-bench", {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    assert tracing is not None
    try:
        on = min(asyncio.run(door(tracing)) for _ in range(7))
    finally:
        tracing.shutdown()
    return {
        "off": round((off - base) * 1e6 / iterations, 2),
        "on": round((on - base) * 1e6 / iterations, 2),
    }


def render(result: dict[str, Any]) -> str:
    cpu, med = result["edge_cpu_ms"], result["median_rps"]
    lines = [
        f"Tracing, non-stream c={result['concurrency']}, median of {result['rounds']} x "
        f"{result['seconds']:g} s (interleaved, three Edges):"
    ]
    for name in STACKS:
        lines.append(f"  {name:8} edge CPU {cpu[name]:.3f} ms/req  {med[name]:8.0f} req/s")
    lines.append(
        f"  on vs off {result['cost_pct']:+.1f}% Edge CPU per request; off vs off (A/A) "
        f"{result['noise_pct']:+.1f}%; {result['exports']} OTLP exports; errors "
        f"{result['errors']}; load average {result['load_before']} -> {result['load_after']}"
    )
    door = result["door_us"]
    lines.append(
        f"  in process: the door adds {door['off']:.2f} us per request with tracing off, "
        f"{door['on']:.2f} us with every request sampled (Edge span only)"
    )
    return "\n".join(lines)


@epilogue
def tracing_epilogue(ctx: BenchContext) -> str:
    """The hook `scripts/bench.py` runs after its rounds (scripts/bench_cells.py)."""
    if ctx.options.suite and "tracing" not in ctx.options.suite:
        return ""
    return render(measure(ctx.upstream_port, ctx.options.seconds, max(ctx.options.rounds, 3)))


def main() -> int:
    return run_alone(__doc__ or "", measure, render, "stack")


if __name__ == "__main__":
    sys.exit(main())
