"""What pricing costs the meter (R-COST-2): CPU microseconds of ``UsageMeter.record()`` per
request with no price and with a price on the request's model group, in process.

The cost is computed when the request is recorded, after its answer: a dict lookup of the
(group, provider) price (built once per snapshot), three integer multiplications and one
more counter (``iop_spend_total``). No database, no Decimal. CPU time
(``time.process_time``), the lowest of ``--rounds`` loops of ``--records`` records each, so
the other processes of a busy machine count as little as they can. Reports, never asserts.

Alone: ``.venv/bin/python scripts/bench_spend.py [--records 20000 --rounds 15]``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "iop_site.settings")

from catalog.config import load_snapshot
from pool.metering import RequestRecord, UsageMeter

PRICE = {"input": 0.15, "output": 0.6, "cached_input": 0.075}


def document(priced: bool) -> dict[str, Any]:
    group: dict[str, Any] = {"id": "bench", "providers": {"p1": "served"}}
    if priced:
        group["price"] = PRICE
    return {
        "openai": {"principal_tokens": [{"token_ref": "app-bench", "principal_ref": "team",
                                         "token_hash_sha256": secrets.token_hex(32)}]},
        "nodes": [{"id": "n1", "token_hash_sha256": secrets.token_hex(32),
                   "providers": [{"id": "p1", "profile": "openai",
                                  "base_url": "http://127.0.0.1:9/v1"}]}],
        "models": [group],
    }  # fmt: skip


def discard(batch: Any, prune_before: Any) -> int:
    return 0


def per_record_us(priced: bool, records: int, rounds: int) -> float:
    snapshot = load_snapshot(document(priced))
    meter = UsageMeter(lambda: snapshot, writer=discard, retention_days=0,
                       max_pending_keys=10**6)  # fmt: skip
    batch = [
        RequestRecord(
            operation="chat_completions",
            model_group="bench",
            provider_id="p1",
            principal_ref="team",
            token_ref="app-bench",
            status=200,
            code=None,
            input_tokens=1000 + i % 97,
            output_tokens=200 + i % 31,
            cached_input_tokens=i % 500,
            estimated=False,
            duration_s=0.1,
            stream=False,
            request_id=f"r{i}",
        )
        for i in range(records)
    ]
    best = float("inf")
    for _ in range(rounds):
        meter.requests.take()
        started = time.process_time()
        for record in batch:
            meter.record(record)
        best = min(best, (time.process_time() - started) * 1e6 / records)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    plain = per_record_us(False, args.records, args.rounds)
    priced = per_record_us(True, args.records, args.rounds)
    again = per_record_us(False, args.records, args.rounds)  # an A/A figure: the noise
    print(f"meter.record(), CPU per request (lowest of {args.rounds} x {args.records}):")
    print(f"  no price    {plain:6.2f} us   (again: {again:.2f} us)")
    print(f"  priced      {priced:6.2f} us   (+{priced - min(plain, again):.2f} us)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
