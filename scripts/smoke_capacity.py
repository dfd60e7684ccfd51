"""Capacity smoke: two model aliases share one capacity-1 provider, end to end.

Starts an Edge, a Node and a loopback OpenAI-compatible upstream (``tests.support.Stack``),
sends N concurrent requests across both aliases (every other one streamed) and checks:

- every request completes with 200 and a whole answer;
- the upstream never serves more than one request at a time, and the pool never shows more
  than one in flight, although both aliases were asked at once (R-CFG-8, R-POOL-2);
- requests really queued meanwhile (otherwise the check above proves nothing);
- afterwards every counter is 0 and the queue is empty (R-POOL-9).

Prints one line per check; exit status 0 when all hold, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from tests.support import Stack  # noqa: E402

PROVIDER = "p-shared"
ALIASES = {"alias-a": "served-a", "alias-b": "served-b"}


@dataclass
class Observed:
    statuses: list[int] = field(default_factory=list)
    incomplete: int = 0
    peak_in_flight: int = 0
    peak_queue: int = 0


async def _one(session: aiohttp.ClientSession, stack: Stack, i: int, seen: Observed) -> None:
    model = list(ALIASES)[i % 2]
    stream = i % 4 >= 2
    body = {"model": model, "stream": stream, "messages": [{"role": "user", "content": f"#{i}"}]}
    async with session.post(
        stack.v1_url + "/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {stack.token}"},
    ) as resp:
        text = await resp.text()
        seen.statuses.append(resp.status)
        whole = text.rstrip().endswith("data: [DONE]") if stream else '"choices"' in text
        if resp.status == 200 and not whole:
            seen.incomplete += 1


async def _watch(session: aiohttp.ClientSession, stack: Stack, seen: Observed) -> None:
    """Sample the pool while the load runs: the provider never holds more than capacity."""
    while True:
        async with session.get(stack.control_url + "/pool") as resp:
            snap: dict[str, Any] = await resp.json()
        row = next(p for p in snap["providers"] if p["provider_id"] == PROVIDER)
        seen.peak_in_flight = max(seen.peak_in_flight, row["in_flight"])
        seen.peak_queue = max(seen.peak_queue, snap["queue_depth"])
        await asyncio.sleep(0.01)


async def _load(stack: Stack, count: int) -> Observed:
    seen = Observed()
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=timeout
    ) as session:
        watcher = asyncio.create_task(_watch(session, stack, seen))
        try:
            await asyncio.gather(*(_one(session, stack, i, seen) for i in range(count)))
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    return seen


def run(count: int, stall_s: float, directory: Path) -> list[tuple[bool, str]]:
    """Start the stack, run the load, return (passed, description) per check."""
    stack = Stack(
        directory,
        providers=[
            {"id": PROVIDER, "profile": "openai", "base_url": "{up:main}/v1", "capacity": 1}
        ],
        models=[
            {"id": alias, "providers": {PROVIDER: served}} for alias, served in ALIASES.items()
        ],
        pool={"max_queue": count, "queue_timeout_ms": 60000},
        log_level="WARNING",
    )
    with stack:
        upstream = stack.upstream().server
        upstream.faults.stall_before_first_byte = stall_s  # requests overlap unless serialized
        seen = asyncio.run(_load(stack, count))
        stack.wait_idle(timeout=10)
        after = stack.pool_snapshot()
        served = sorted({(r.json or {}).get("model") for r in upstream.requests})
        ok = seen.statuses.count(200)
        checks = [
            (
                ok == count and not seen.incomplete,
                f"{ok}/{count} requests completed whole across {', '.join(ALIASES)}"
                f" ({seen.incomplete} cut short)",
            ),
            (served == sorted(ALIASES.values()), f"upstream saw served models {served}"),
            (upstream.peak == 1, f"upstream peak concurrency {upstream.peak} (capacity 1)"),
            (seen.peak_in_flight == 1, f"pool in_flight peak {seen.peak_in_flight}"),
            (seen.peak_queue >= 1, f"queue depth peak {seen.peak_queue} (requests did wait)"),
            (
                after["queue_depth"] == 0
                and all(
                    p["in_flight"] == p["long_in_flight"] == p["queued"] == 0
                    for p in after["providers"]
                ),
                "afterwards every counter is 0 and the queue is empty",
            ),
        ]
        if not all(passed for passed, _ in checks):
            print(stack.logs()[-4000:], file=sys.stderr)
        return checks


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=12, help="concurrent requests (>= 2)")
    parser.add_argument(
        "--stall",
        type=float,
        default=0.05,
        help="seconds the upstream waits before answering each request",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="iop-smoke-") as directory:
        checks = run(max(2, args.requests), args.stall, Path(directory))
    for passed, text in checks:
        print(("ok    " if passed else "FAIL  ") + text)
    return 0 if all(passed for passed, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
