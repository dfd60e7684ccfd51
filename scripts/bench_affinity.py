"""Cache affinity under a multi-turn workload (R-AFF-2; the ``affinity`` epilogue of `make
bench`, docs/pool.md "Cache affinity"; also ``.venv/bin/python scripts/bench_affinity.py``).

A fresh Edge and Node with three providers of capacity 4, each on its own fake upstream that
models a prefix cache: the first byte comes after ``COLD_S`` for a conversation head it has
not seen and ``WARM_S`` for one it has (``FakeOpenAI.prefix_cache``). ``CONVERSATIONS``
conversations of ``TURNS`` turns each, ``CLIENTS`` at a time, streamed; the same workload on a
group with ``affinity: {key: prefix}`` and on one without. Reported: the share of turns after
the first that found their head warm (hit rate) and the time to the first byte, p50, as the
client measures it. Bounded by ``TIMEOUT_S``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from bench_cells import stack_epilogue  # noqa: E402

COLD_S, WARM_S = 0.08, 0.01
CONVERSATIONS, TURNS, CLIENTS = 30, 4, 6
TIMEOUT_S = 180.0
UPSTREAMS = {"u1": "openai", "u2": "openai", "u3": "openai"}
PROVIDERS = [
    {"id": f"p{i}", "profile": "openai", "base_url": f"{{up:u{i}}}/v1", "capacity": 4}
    for i in (1, 2, 3)
]
ALL = {f"p{i}": "served" for i in (1, 2, 3)}
MODELS = [
    {"id": "with", "providers": ALL, "affinity": {"key": "prefix", "ttl_s": 600}},
    {"id": "without", "providers": ALL},
]


def _turn(model: str, conversation: int, n: int) -> dict[str, Any]:
    messages = [{"role": "system", "content": f"conversation {model}-{conversation}"}]
    for i in range(n + 1):
        messages.append({"role": "user", "content": f"turn {i}"})
        if i < n:
            messages.append({"role": "assistant", "content": f"answer {i}"})
    return {"model": model, "messages": messages, "stream": True}


def _workload(url: str, token: str, model: str) -> list[float]:
    """Every conversation's turns in order, ``CLIENTS`` conversations at once; first-byte
    times of the turns after the first."""
    deadline = time.monotonic() + TIMEOUT_S / 2
    times: list[float] = []

    def conversation(c: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            for n in range(TURNS):
                if time.monotonic() > deadline:
                    return
                started = time.perf_counter()
                with http.stream(
                    "POST", "/v1/chat/completions", json=_turn(model, c, n),
                    headers={"authorization": f"Bearer {token}"},
                ) as answer:  # fmt: skip
                    answer.raise_for_status()
                    first: float | None = None
                    for _ in answer.iter_bytes():
                        first = first or time.perf_counter() - started
                    if n and first is not None:
                        times.append(first)

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(conversation, range(CONVERSATIONS)))
    return times


def measure(directory: Path) -> str:
    from tests.support import Stack

    with Stack(
        directory, upstreams=UPSTREAMS, providers=PROVIDERS, models=MODELS, log_level="WARNING"
    ) as stack:
        fakes = [stack.upstream(name).server for name in UPSTREAMS]
        lines = []
        for model in ("without", "with"):
            for fake in fakes:
                fake.prefix_cache, fake.warm_hits = (COLD_S, WARM_S), 0
            ttfb = _workload(stack.openai_url, stack.token, model)
            hits = sum(fake.warm_hits for fake in fakes)
            later = CONVERSATIONS * (TURNS - 1)
            lines.append(
                f"{model} affinity: hit rate {hits / later * 100:.0f} % of {later} later turns, "
                f"first byte p50 {statistics.median(ttfb) * 1000:.1f} ms"
            )
    return (
        f"Cache affinity (R-AFF-2; 3 providers of capacity 4, {CONVERSATIONS} conversations x "
        f"{TURNS} turns, {CLIENTS} at once, first byte {COLD_S * 1000:.0f} ms cold / "
        f"{WARM_S * 1000:.0f} ms warm): " + "; ".join(lines)
    )


stack_epilogue("affinity", "Cache affinity", measure, (httpx.HTTPError,))

if __name__ == "__main__":
    print(measure(Path(tempfile.mkdtemp(prefix="iop-bench-affinity-"))))
