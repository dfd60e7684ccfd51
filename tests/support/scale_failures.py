"""Helpers of the scale-out failure tests (R-SCALE-2/3, docs/scale-out.md "Failures"): a
``Cluster`` on a redis-server of the test's own (so a test may kill and restart it), an exact
read of the shared pool's keys, and bounded polling that returns how long it took."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openai
import redis

from tests.support.cluster import Cluster

WITHIN_S = 30.0  # the failure bound of every wait; never an assertion on timing


def eventually(
    predicate: Callable[[], bool],
    what: str,
    within: float = WITHIN_S,
    state: Callable[[], Any] | None = None,
) -> float:
    """Poll ``predicate`` until it holds; the seconds it took (AssertionError after ``within``,
    with ``state()`` when given)."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > within:
            seen = f" ({state()})" if state is not None else ""
            raise AssertionError(f"{what}: not reached within {within:.0f} s{seen}")
        time.sleep(0.02)
    return time.monotonic() - start


@dataclass
class PoolKeys:
    """The shared pool's state read from its Redis keys (exact, not an Edge's local view)."""

    leases: int
    queued: int
    in_flight: dict[str, int]
    owners: dict[str, int]
    nodes: dict[str, str]  # node id -> the Edge it is ready on
    policy_version: int

    def idle(self) -> bool:
        return (
            self.leases == 0
            and self.queued == 0
            and not any(self.in_flight.values())
            and not any(self.owners.values())
        )


def store_client(cluster: Cluster, **kwargs: Any) -> redis.Redis:
    """A client of the cluster's store: its Redis, or the primary Sentinel names (R-HA-1)."""
    from pool.engine_redis.connect import parse

    assert cluster.redis_url is not None
    return parse(cluster.redis_url).sync_client(**kwargs)


def read_pool(cluster: Cluster) -> PoolKeys:
    assert cluster.redis_url is not None
    client = store_client(cluster, decode_responses=True)
    p = cluster.redis_prefix
    try:
        in_flight: dict[str, int] = {}
        for key in client.scan_iter(match=f"{p}:prov:*", count=1000):
            row = client.hgetall(key)
            pid = key[len(f"{p}:prov:") :]
            in_flight[pid] = int(row.get("in_flight", 0)) + int(row.get("long_in_flight", 0))
        nodes = {}
        for key in client.scan_iter(match=f"{p}:node:*", count=1000):
            edge = client.hget(key, "edge")
            if edge is not None:
                nodes[key[len(f"{p}:node:") :]] = edge
        owners = {k: int(v) for k, v in client.hgetall(f"{p}:owners").items()}
        return PoolKeys(
            leases=int(client.zcard(f"{p}:leases")),
            queued=int(client.zcard(f"{p}:queue")),
            in_flight=in_flight,
            owners=owners,
            nodes=nodes,
            policy_version=int(client.hget(f"{p}:policy", "version") or 0),
        )
    finally:
        client.close()


def alive_key(cluster: Cluster, index: int) -> bool:
    """Whether Edge ``index``'s ``{P}:alive:{id}`` key exists (it renews it while it lives)."""
    assert cluster.redis_url is not None
    client = store_client(cluster)
    try:
        return bool(client.exists(f"{cluster.redis_prefix}:alive:{cluster.edges[index].edge_id}"))
    finally:
        client.close()


def restart_edge(cluster: Cluster, index: int) -> None:
    """Start a killed Edge again under its id, once its alive key has expired (an id held by
    a live Edge is refused at start)."""
    eventually(lambda: not alive_key(cluster, index), f"edge-{index}'s alive key expired")
    cluster.start_edge(index)


def client(cluster: Cluster, index: int, timeout: float = 30.0) -> openai.OpenAI:
    """The official SDK against Edge ``index``; no retries: every answer is seen."""
    return openai.OpenAI(
        base_url=cluster.edges[index].openai_url + "/v1",
        api_key=cluster.token,
        max_retries=0,
        timeout=timeout,
    )


def ask(cluster: Cluster, index: int, model: str, text: str) -> tuple[int, str]:
    """One chat completion through Edge ``index``: (status, content or error ``code``)."""
    with client(cluster, index) as sdk:
        try:
            answer = sdk.chat.completions.create(
                model=model, messages=[{"role": "user", "content": text}]
            )
        except openai.APIStatusError as exc:
            body: Any = exc.response.json()
            return exc.status_code, str(body.get("error", {}).get("code"))
        except openai.APITimeoutError:
            return 0, "timeout"
        except openai.APIConnectionError:
            return 0, "connection"
        return 200, answer.choices[0].message.content or ""


def set_peak(cluster: Cluster, name: str, value: int = 0) -> None:
    """Reset an upstream's concurrency gauge (its ``peak``) between phases of a test."""
    server = cluster.upstream(name).server

    async def reset() -> None:
        server.peak = value

    cluster.upstream(name).call(reset())


def apply_document(
    url: str, document: dict[str, Any], parent: int | None = None
) -> tuple[int, Any]:
    """``POST /refresh`` mode apply on the control listener at ``url`` (built on ``parent``
    when given): (status, report)."""
    import json
    import urllib.error
    import urllib.request

    fields: dict[str, Any] = {"mode": "apply", "config": document}
    if parent is not None:
        fields["parent"] = parent
    body = json.dumps(fields).encode()
    request = urllib.request.Request(
        url + "/refresh", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def at_once(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls on threads released together; their results in order."""
    import threading

    results: list[Any] = [None] * len(calls)
    gate = threading.Barrier(len(calls))

    def run(index: int) -> None:
        gate.wait()
        results[index] = calls[index]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


class Load:
    """``threads`` clients asking chat completions of ``model`` in a loop, spread over
    ``edges`` Edges, while the ``with`` block runs; ``results`` holds (started, ended, Edge,
    status, code) per answer."""

    def __init__(self, cluster: Cluster, *, edges: int, threads: int = 6, model: str = "gpt-test"):
        import threading

        self.results: list[tuple[float, float, int, int, str]] = []
        self._stop = threading.Event()

        def load(index: int) -> None:
            while not self._stop.is_set():
                started = time.monotonic()
                status, code = ask(cluster, index, model, "x")
                self.results.append((started, time.monotonic(), index, status, code))

        self._threads = [
            threading.Thread(target=load, args=(i % edges,), daemon=True) for i in range(threads)
        ]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
