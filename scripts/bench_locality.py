"""Routed share and p50 with locality (R-SCALE-5; docs/scale-out.md, "Locality").

Two Edges in scale-out mode on the local PostgreSQL and Redis (``IOP_TEST_DATABASE_URL``,
``IOP_TEST_REDIS_URL``, else the local defaults), one Node on each, model ``bench`` on both
Nodes' providers (capacity 256, a loopback fake upstream): 300 requests one at a time through
Edge A, then 800 at 8 at once alternating over the two Edges. A run is *routed* when it
crossed to the other Edge's Node: counted from the orders in the run streams
(``{P}:edge:*:runs``). The test harness is the same code (``tests.support.cluster``).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from tests.support.cluster import Cluster  # noqa: E402

DATABASE = (
    os.environ.get("IOP_TEST_DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS = os.environ.get("IOP_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"


def provider(k: int) -> dict[str, object]:
    return {"id": f"p-{k}", "profile": "openai", "capacity": 256, "base_url": "{up:main}/v1"}


def main() -> None:
    cluster = Cluster(
        Path(tempfile.mkdtemp(prefix="iop-locality-")),
        database_url=DATABASE,
        edges=2,
        redis_url=REDIS,
        lease_ttl_s=10.0,
        revision_poll_s=1.0,
        nodes=[{"id": f"node-{k}", "providers": [provider(k)]} for k in (1, 2)],
        models=[{"id": "bench", "providers": {"p-1": "served", "p-2": "served"}}],
        pool={"max_queue": 1024},
        log_level="WARNING",
    )
    with cluster:
        for index in (0, 1):
            assert cluster.chat(index, "bench")[0] == 200
        client = redis.Redis.from_url(REDIS)
        body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "hi"}]})

        def orders() -> int:
            keys = client.scan_iter(match=f"{cluster.redis_prefix}:edge:*:runs", count=1000)
            return sum(b'"t":"open"' in f[b"m"] for key in keys for _, f in client.xrange(key))

        def ask(index: int) -> float:
            request = urllib.request.Request(
                cluster.edges[index % 2].openai_url + "/v1/chat/completions",
                data=body.encode(),
                headers={
                    "Authorization": f"Bearer {cluster.token}",
                    "Content-Type": "application/json",
                },
            )
            started = time.perf_counter()
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
            return time.perf_counter() - started

        before = orders()
        latencies = [ask(0) for _ in range(300)]
        routed = orders() - before
        print(f"c=1 on Edge A: 300 runs, {routed} routed ({routed / 3:.0f}%), "
              f"p50 {statistics.median(latencies) * 1000:.2f} ms")  # fmt: skip
        before = orders()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(ask, range(800)))
        routed = orders() - before
        print(f"c=8 over both Edges: 800 runs, {routed} routed ({routed / 8:.0f}%)")
        client.close()
    cluster.remove()  # its logs and configs: the database and the key prefix are gone already


if __name__ == "__main__":
    main()
