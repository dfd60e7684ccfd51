"""The queue's wait estimate under steady load (R-QUEUE-3; the ``queue`` epilogue of `make
bench`, docs/pool.md "The estimate"; also ``.venv/bin/python scripts/bench_queue.py``).

A fresh Edge and Node (tests.support.Stack) with one provider of capacity 2 whose fake
upstream answers each request after ``JOB_S``; ``CLIENTS`` clients send requests one after
another for ``REQUESTS`` requests in all, so about ``CLIENTS - 2`` wait at any moment. Every
answer that queued carries the estimate it was admitted on (``x-iop-queue-eta-ms``) beside its
actual wait (``x-iop-queue-wait-ms``): the median absolute error of the estimate, relative to
the actual wait, after the first ``WARMUP`` answers (goal: within 25 %). Bounded by
``TIMEOUT_S``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from bench_cells import stack_epilogue  # noqa: E402

JOB_S = 0.1
CAPACITY = 2
CLIENTS = 8
REQUESTS = 400
WARMUP = 40
TIMEOUT_S = 120.0
BODY = {"model": "queued", "messages": [{"role": "user", "content": "ping"}]}


def measure(directory: Path) -> str:
    from tests.support import Stack

    providers = [
        {"id": "p-q", "profile": "openai", "base_url": "{up:main}/v1", "capacity": CAPACITY}
    ]
    models = [{"id": "queued", "providers": {"p-q": "served"}}]
    with Stack(directory, providers=providers, models=models, log_level="WARNING") as stack:
        stack.upstream("main").server.faults.stall_before_first_byte = JOB_S
        deadline = time.monotonic() + TIMEOUT_S
        headers = {"authorization": f"Bearer {stack.token}"}
        seen: list[tuple[float, int, int | None]] = []  # (when, wait ms, eta ms)

        def client(_: int) -> None:
            with httpx.Client(base_url=stack.openai_url, timeout=30, headers=headers) as http:
                while len(seen) < REQUESTS and time.monotonic() < deadline:
                    answer = http.post("/v1/chat/completions", json=BODY)
                    answer.raise_for_status()
                    eta = answer.headers.get("x-iop-queue-eta-ms")
                    wait = int(answer.headers["x-iop-queue-wait-ms"])
                    seen.append((time.monotonic(), wait, int(eta) if eta else None))

        with ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(client, range(CLIENTS)))
    queued = [(w, e) for _, w, e in sorted(seen)[WARMUP:] if e is not None and w > 0]
    if not queued:
        return "Queue estimate: no answer queued with an estimate"
    errors = [abs(e - w) / w for w, e in queued]
    median = statistics.median(errors) * 100
    waits = statistics.median(w for w, _ in queued)
    return (
        f"Queue estimate (R-QUEUE-3): {len(queued)} of {len(seen)} answers queued with an "
        f"estimate (capacity {CAPACITY}, {CLIENTS} clients, {JOB_S * 1000:.0f} ms jobs, median "
        f"wait {waits:.0f} ms): median absolute error {median:.1f} % of the actual wait "
        f"(goal: <= 25 %)"
    )


stack_epilogue("queue", "Queue estimate", measure, (httpx.HTTPError,))

if __name__ == "__main__":
    print(measure(Path(tempfile.mkdtemp(prefix="iop-bench-queue-"))))
