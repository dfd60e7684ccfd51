"""`make bench` cell: what per-token policy checks cost at c=16 (R-PRIN-1..3, R-BUD-1,
R-FALL-1).

One Edge with four principal tokens: ``plain`` and ``control`` (no policy), ``limited``
(a model scope, max_in_flight, rpm, tpm and max_queued, all too high to ever refuse) and
``budgeted`` (a budget too high to ever refuse, asking a model group that has a fallback
which is never needed). wrk runs non-stream chat at c=16 with each token in turn, the order
rotating per round, on the same Edge and upstream. The cost of a policy is the ratio of the
medians of its token and ``plain``; the same ratio for ``control`` (an A/A run) is the noise
floor of that invocation. Reports, never asserts (docs/performance-history.md, "Per-token
limits").

Alone: ``.venv/bin/python scripts/bench_limits.py [--seconds 3 --rounds 5]``.

``--scale REDIS_URL`` (with ``--postgres URL``): the same on one Edge in scale-out mode, where
the limits are counted in Redis (R-SCALE-6), at ``--concurrency`` 1 and 16; it also times the
shared limiter alone in process (admit + finish against that Redis, sequential and 16 at once)
beside the in-memory one (docs/scale-out.md, "Per-token limits across Edges").
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "scripts")) if p not in sys.path]

from bench_cells import BenchContext, epilogue, run_alone  # noqa: E402
from bench_client import WrkResult, cpu_seconds, run_wrk  # noqa: E402

from tests.support import Stack, sha256_hex  # noqa: E402

CONCURRENCY = 16
BODY = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "ping"}]}).encode()
FALLBACK_BODY = BODY.replace(b'"bench"', b'"bench-fb"')  # a group with a fallback, not used
NEVER = 2**31 - 1
TOKENS = ("plain", "control", "limited", "budgeted")
BUDGETED_POLICY = {"budget": {"tokens": 10**15, "period": "month"}}
LIMITED_POLICY = {
    "models": ["bench"],
    "max_in_flight": 100_000,
    "rpm": NEVER,
    "tpm": NEVER,
    "max_queued": 1024,
}


POLICIES = {"limited": LIMITED_POLICY, "budgeted": BUDGETED_POLICY}


def _token(name: str, raw: str, policy: dict[str, Any]) -> dict[str, Any]:
    return {
        "token_ref": f"bench-{name}",
        "principal_ref": f"bench-{name}",
        "token_hash_sha256": sha256_hex(raw),
        **policy,
    }


def measure(
    upstream_port: int,
    seconds: float,
    rounds: int,
    concurrency: int = CONCURRENCY,
    scale: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """Median requests/s of each token over ``rounds`` interleaved wrk runs on one Edge
    (``scale`` = (Redis URL, PostgreSQL URL): in scale-out mode)."""
    raw = {name: "bench-" + secrets.token_urlsafe(24) for name in TOKENS}
    load_before = os.getloadavg()
    stack_class: Any = Stack
    extra: dict[str, Any] = {}
    if scale is not None:
        from tests.support.cluster import Cluster

        stack_class = Cluster
        extra = {"edges": 1, "redis_url": scale[0], "database_url": scale[1],
                 "database_prefix": "iop_bench_limits", "lease_ttl_s": 10.0}  # fmt: skip
    with (
        tempfile.TemporaryDirectory(prefix="iop-bench-limits-") as directory,
        stack_class(
            Path(directory),
            upstreams={},
            providers=[
                {
                    "id": "p-bench",
                    "profile": "openai",
                    "capacity": 256,
                    "base_url": f"http://127.0.0.1:{upstream_port}/v1",
                }
            ],
            models=[
                {"id": "bench", "providers": {"p-bench": "bench-served"}},
                {
                    "id": "bench-fb",
                    "providers": {"p-bench": "bench-served"},
                    "fallbacks": ["bench"],
                },
            ],
            pool={"max_queue": 1024},
            openai={
                "principal_tokens": [
                    _token(name, raw[name], POLICIES.get(name, {})) for name in TOKENS
                ]
            },
            log_level="WARNING",
            **extra,
        ) as stack,
    ):
        if scale is not None:
            stack.token = raw["plain"]
            answer = stack.chat(0, "bench")  # past the fresh prefix's recovery grace
            assert answer[0] == 200, answer
        url = stack.v1_url + "/chat/completions"
        assert stack.edge is not None and stack.edge.popen is not None
        edge_pid = stack.edge.popen.pid
        cpu_ms: dict[str, list[float]] = {name: [] for name in TOKENS}
        bodies = {name: FALLBACK_BODY if name == "budgeted" else BODY for name in TOKENS}
        for name, token in raw.items():  # warm-up: connections, caches
            run_wrk(url, bodies[name], token, concurrency, 1)
        runs: dict[str, list[WrkResult]] = {name: [] for name in TOKENS}
        for turn in range(rounds):
            order = TOKENS[turn % len(TOKENS) :] + TOKENS[: turn % len(TOKENS)]
            for name in order:
                cpu_before = cpu_seconds(edge_pid)
                result = run_wrk(url, bodies[name], raw[name], concurrency, seconds)
                cpu = (cpu_seconds(edge_pid) - cpu_before) * 1000 / max(1, result.requests)
                cpu_ms[name].append(cpu)
                print(
                    f"limits {name:8} c={concurrency} {result.rps:8.0f} req/s "
                    f"p50 {result.p50_ms:.2f} ms edge CPU {cpu:.3f} ms/req errors {result.errors}",
                    file=sys.stderr,
                    flush=True,
                )
                runs[name].append(result)
        if scale is None:
            stack.wait_idle()
    medians = {name: statistics.median(r.rps for r in found) for name, found in runs.items()}
    return {
        "mode": "scale-out (Redis)" if scale is not None else "one Edge (in memory)",
        "concurrency": concurrency,
        "rounds": rounds,
        "seconds": seconds,
        "rps": {name: [round(r.rps, 1) for r in found] for name, found in runs.items()},
        "median_rps": {name: round(value, 1) for name, value in medians.items()},
        "p50_ms": {
            name: round(statistics.median(r.p50_ms for r in found), 3)
            for name, found in runs.items()
        },
        "edge_cpu_ms": {name: round(statistics.median(found), 4) for name, found in cpu_ms.items()},
        "errors": {name: sum(r.errors for r in found) for name, found in runs.items()},
        "cost_pct": round(100 * (1 - medians["limited"] / medians["plain"]), 2),
        "budget_cost_pct": round(100 * (1 - medians["budgeted"] / medians["plain"]), 2),
        "noise_pct": round(100 * (1 - medians["control"] / medians["plain"]), 2),
        "check_us": round(check_cost_us(), 3),
        "budget_us": round(budget_cost_us(), 3),
        "money_budget_us": round(budget_cost_us(money=True), 3),
        "load_before": [round(v, 2) for v in load_before],
        "load_after": [round(v, 2) for v in os.getloadavg()],
    }


def check_cost_us(iterations: int = 200_000) -> float:
    """In-process cost of one request's checks: admit, the headers, finish (microseconds)."""
    from pool.http.limits import TokenLimiter, TokenLimits

    limiter = TokenLimiter()
    limits = TokenLimits(max_in_flight=100_000, rpm=NEVER, tpm=NEVER)
    started = time.perf_counter()
    for _ in range(iterations):
        ticket = limiter.admit("bench-limited", limits, 20)
        if ticket.quota is not None:
            ticket.quota.headers()
        limiter.finish(ticket, 30)
    return (time.perf_counter() - started) * 1e6 / iterations


def shared_cost(redis_url: str, requests: int = 2000) -> dict[str, float]:
    """The shared limiter alone (R-SCALE-6): µs of wall time and of this process's CPU per
    request (admit + finish, the settle sent in the writer's pipelines), one at a time and 16
    at once, against ``redis_url`` under a fresh key prefix."""
    import asyncio

    from pool.http.limits import TokenLimits
    from pool.http.limits_shared import SharedTokenLimiter

    limits = TokenLimits(max_in_flight=100_000, rpm=NEVER, tpm=NEVER)
    prefix = f"iop-bench-{secrets.token_hex(4)}"

    async def one(limiter: SharedTokenLimiter) -> None:
        ticket = await limiter.admit("bench-limited", limits, 20)
        if ticket.quota is not None:
            ticket.quota.headers()
        limiter.finish(ticket, 30)

    async def run() -> dict[str, float]:
        limiter = SharedTokenLimiter(redis_url, prefix=prefix)
        await limiter.start()
        out: dict[str, float] = {}
        try:
            for _ in range(200):  # warm-up: connection, script load
                await one(limiter)
            for label, width in (("c1", 1), ("c16", 16)):
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(requests // width):
                    await asyncio.gather(*(one(limiter) for _ in range(width)))
                await limiter.flush()
                n = (requests // width) * width
                out[f"{label}_wall_us"] = (time.perf_counter() - wall) * 1e6 / n
                out[f"{label}_cpu_us"] = (time.process_time() - cpu) * 1e6 / n
        finally:
            await limiter.aclose()
            import redis

            client = redis.Redis.from_url(redis_url)
            for key in client.scan_iter(f"{prefix}:*"):
                client.delete(key)
            client.close()
        return out

    return asyncio.run(run())


def budget_cost_us(iterations: int = 200_000, money: bool = False) -> float:
    """In-process cost of one budgeted request's own work: the admission check with its
    headers and the meter's add (microseconds); against the same loop with no budget.
    ``money``: a budget in money (R-COST-3), its headers in the currency."""
    from pool.http.budgets import BudgetLimit, Budgets
    from pool.metering.budget_view import BudgetView, Counted

    def loop(kinds: dict[str, Counted], limits: dict[str, BudgetLimit]) -> float:
        view = BudgetView()
        view.configure(kinds)
        budgets = Budgets(view)
        budgets._limits = limits  # the snapshot's, without building one
        started = time.perf_counter()
        for _ in range(iterations):
            budgets.admit("bench-budgeted")
            view.add("bench-budgeted", 0, 30, 4_500_000)
        return (time.perf_counter() - started) * 1e6 / iterations

    limit = BudgetLimit.of(10**15, money, "USD")
    budgeted = loop({"bench-budgeted": Counted("month", money)}, {"bench-budgeted": limit})
    return budgeted - loop({}, {})


def render(result: dict[str, Any]) -> str:
    med, p50, cpu = result["median_rps"], result["p50_ms"], result["edge_cpu_ms"]
    return "\n".join(
        [
            f"Per-token limit checks, non-stream c={result['concurrency']}, median of "
            f"{result['rounds']} x {result['seconds']:g} s (interleaved, "
            f"{result.get('mode', 'one Edge')}):",
            f"  no policy      {med['plain']:8.0f} req/s  p50 {p50['plain']:.2f} ms  "
            f"edge CPU {cpu['plain']:.3f} ms/req",
            f"  no policy (A/A){med['control']:8.0f} req/s  p50 {p50['control']:.2f} ms  "
            f"edge CPU {cpu['control']:.3f} ms/req",
            f"  scope + limits {med['limited']:8.0f} req/s  p50 {p50['limited']:.2f} ms  "
            f"edge CPU {cpu['limited']:.3f} ms/req",
            f"  budget+fallback{med['budgeted']:8.0f} req/s  p50 {p50['budgeted']:.2f} ms  "
            f"edge CPU {cpu['budgeted']:.3f} ms/req",
            f"  cost {result['cost_pct']:+.2f}% throughput (target < 3%), budget and fallback "
            f"configured {result['budget_cost_pct']:+.2f}%; noise floor "
            f"(A/A) {result['noise_pct']:+.2f}%; errors "
            f"{result['errors']}; load average {result['load_before']} -> "
            f"{result['load_after']}",
            f"  in process: {result['check_us']:.2f} us per request for admit + headers + finish; "
            f"a budget adds {result['budget_us']:.2f} us (check, headers, count), one in money "
            f"{result.get('money_budget_us', 0.0):.2f} us",
        ]
    )


def cell(upstream_port: int, seconds: float, rounds: int) -> str:
    """Measure and render."""
    return render(measure(upstream_port, seconds, max(rounds, 3)))


@epilogue
def limits_epilogue(ctx: BenchContext) -> str:
    """The hook `scripts/bench.py` runs after its rounds (scripts/bench_cells.py)."""
    if ctx.options.suite and "limits" not in ctx.options.suite:
        return ""
    return cell(ctx.upstream_port, ctx.options.seconds, ctx.options.rounds)


def main() -> int:
    # The scale-out options (module docstring); the rest is every cell's own (run_alone).
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--concurrency", type=int, default=CONCURRENCY)
    extra.add_argument("--scale", metavar="REDIS_URL")
    extra.add_argument(
        "--postgres",
        default=os.environ.get("IOP_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/x"),
    )
    known, sys.argv[1:] = extra.parse_known_args()
    scale = (known.scale, known.postgres) if known.scale else None
    if scale is not None:
        costs = shared_cost(known.scale)
        print(
            "in process: in-memory limiter {:.2f} us; shared limiter c=1 {c1_wall_us:.0f} us wall "
            "{c1_cpu_us:.0f} us CPU, c=16 {c16_wall_us:.0f} us wall {c16_cpu_us:.0f} us CPU "
            "per request".format(check_cost_us(), **costs)
        )

    def measured(port: int, seconds: float, rounds: int) -> dict[str, Any]:
        return measure(port, seconds, rounds, known.concurrency, scale)

    return run_alone(__doc__ or "", measured, render, "token")


if __name__ == "__main__":
    sys.exit(main())
