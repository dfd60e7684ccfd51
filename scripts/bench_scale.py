"""The scale-out cells of `make bench` (R-SCALE-2; docs/performance-history.md, "Scale-out").

Three clusters of real Edges and Nodes (``tests.support.cluster.Cluster``, the code behind
``scripts/scale_local.py``) on the local PostgreSQL, with the bench's shared upstream, every
Node holding one provider of capacity 256 on it:

- ``scale-mem``: one Edge with the in-memory pool engine, two Nodes (the baseline);
- ``scale-redis``: the same with the Redis engine (``IOP_REDIS_URL``, its own key prefix);
- ``scale-2e``: two Edges on the Redis engine, one Node on each. ``scale-rr``: model ``bench``
  (both Nodes' providers), wrk's connections alternating over the two Edges;
  ``scale-local`` / ``scale-cross``: model ``bench-cross`` (only the provider of the Node on
  Edge A) asked on Edge A, or on Edge B, whose runs then go to Edge A (run routing).

Every Edge and Node runs unpinned: two Edges on two cores compete with each other and with
their Nodes, so the figure to compare is CPU per request summed over the processes. The cells
run only when Redis and PostgreSQL answer; otherwise the report says why they were skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import secrets
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from bench_cells import BODIES, BenchContext, Cell, Target, pin_process, section, suite
from bench_client import cpu_seconds
from bench_report import Figures, Key

MEM, REDIS, RR, LOCAL, CROSS = "scale-mem", "scale-redis", "scale-rr", "scale-local", "scale-cross"
REDIS_URL = "redis://127.0.0.1:6379/0"
DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DATABASE_PREFIX = "iop_scale_bench"  # a new database per cluster, dropped at the end
LEASE_TTL_S = 10.0  # the documented defaults (docs/configuration.md): renewals as deployed
REVISION_POLL_S = 1.0
CROSS_BODIES = {mode: {**body, "model": "bench-cross"} for mode, body in BODIES.items()}
CONCURRENCY = (1, 16)  # added latency at c=1, throughput at c=16 (two Edges: c=16 only)
IDLE_S = 3.0  # how long every Edge's CPU is read at rest, all clusters up, before the load
SKIPPED: list[str] = []  # why the cells did not run, for the report
AT_REST: dict[str, float] = {}  # "cluster: process" -> CPU ms per second before the load


def redis_url(options: Any) -> str:
    return str(options.redis or os.environ.get("IOP_TEST_REDIS_URL") or REDIS_URL)


def database_url(options: Any) -> str:
    return str(options.postgres or os.environ.get("IOP_TEST_DATABASE_URL") or DATABASE_URL)


def _where(url: str) -> str:
    """host:port of a URL, never its password."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or ''}"


def unavailable(redis: str, database: str) -> str | None:
    """Why the scale-out cells cannot run here, or None: Redis and PostgreSQL answer within
    2 s and the build has the Redis engine and run routing."""
    clients = [m for m in ("redis", "psycopg") if importlib.util.find_spec(m) is None]
    if clients:
        return f"this environment lacks {', '.join(clients)}"
    import psycopg
    import redis as redis_py

    from tests.support.cluster import with_database

    client = redis_py.Redis.from_url(redis, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    except redis_py.RedisError as exc:
        return f"Redis at {_where(redis)} does not answer ({type(exc).__name__})"
    finally:
        client.close()
    try:
        with psycopg.connect(with_database(database, "postgres"), connect_timeout=2):
            pass
    except psycopg.Error as exc:
        return f"PostgreSQL at {_where(database)} does not answer ({type(exc).__name__})"
    parts = [
        m for m in ("pool.engine_redis", "nodes.remote") if importlib.util.find_spec(m) is None
    ]
    if parts:
        return f"this build lacks {', '.join(parts)}"
    return None


def _cluster(ctx: BenchContext, name: str, edges: int, redis: str | None) -> Any:
    """A cluster of ``edges`` Edges and two Nodes (``node-1`` on the first Edge, ``node-2`` on
    the last): ``bench`` is served by both Nodes' providers, ``bench-cross`` by node-1's."""
    from tests.support.cluster import Cluster

    base_url = f"http://127.0.0.1:{ctx.upstream_port}/v1"
    providers = {
        k: {"id": f"p-{k}", "profile": "openai", "capacity": 256, "base_url": base_url}
        for k in (1, 2)
    }
    cluster = Cluster(
        ctx.workdir / name,
        database_url=database_url(ctx.options),
        edges=edges,
        redis_url=redis,
        database_prefix=DATABASE_PREFIX,
        lease_ttl_s=LEASE_TTL_S,
        revision_poll_s=REVISION_POLL_S,
        upstreams={},
        nodes=[{"id": f"node-{k}", "providers": [providers[k]]} for k in (1, 2)],
        models=[
            {"id": "bench", "providers": {"p-1": "bench-served", "p-2": "bench-served"}},
            {"id": "bench-cross", "providers": {"p-1": "bench-served"}},
        ],
        pool={"max_queue": 1024},
        # The in-memory cluster must not inherit a scale-out setting from the shell.
        env={} if redis else {"IOP_REDIS_URL": ""},
        log_level="WARNING",
    )
    cluster.redis_prefix = f"iop-bench-scale-{secrets.token_hex(4)}"
    return cluster


def _started(ctx: BenchContext, name: str, cluster: Any) -> dict[str, int]:
    """Wait until every Edge serves (a fresh Redis prefix refuses admissions for one TTL,
    docs/scale-out.md), give every process all CPUs back; the pids, named for the report."""
    for handle in cluster.edges:
        status, answer = cluster.chat(handle.index, "bench")
        if status != 200:
            raise RuntimeError(f"{name} {handle.edge_id} answered {status}: {answer}")
    pids = {f"edge-{h.index}" if len(cluster.edges) > 1 else "edge": h.proc.popen.pid
            for h in cluster.edges}  # fmt: skip
    pids.update({proc.name: proc.popen.pid for proc in cluster.nodes})
    for process, pid in pids.items():
        pin_process(pid, ctx.all_cpus)  # children inherit bench.py's own pinning
        ctx.memory_pids[f"{name}: {process}"] = pid
    return pids


def _owner(cluster: Any, node_id: str) -> int:
    """The index of the Edge ``node_id`` is connected to, as run routing reads it
    (``{P}:node:{node_id}`` field ``edge``, docs/scale-out.md)."""
    import redis as redis_py

    client = redis_py.Redis.from_url(cluster.redis_url, socket_timeout=5)
    try:
        edge = client.hget(f"{cluster.redis_prefix}:node:{node_id}", "edge")
    finally:
        client.close()
    for handle in cluster.edges:
        if edge is not None and edge.decode() == handle.edge_id:
            return int(handle.index)
    raise RuntimeError(f"{node_id} is on no Edge of the cluster (Redis says {edge!r})")


@suite("scale")
def scale_suite(ctx: BenchContext) -> Iterator[list[Cell]]:
    """One Edge in memory against one on Redis; one Redis Edge against two; a run crossing
    Edges against the same run on the Node's own Edge. json only."""
    redis, database = redis_url(ctx.options), database_url(ctx.options)
    reason = unavailable(redis, database)
    if reason is not None:
        SKIPPED.append(reason)
        yield []
        return
    with contextlib.ExitStack() as stack:
        targets: list[tuple[Target, tuple[int, ...]]] = []
        clusters = []
        by_cluster: dict[str, dict[str, int]] = {}
        for name, edges, url in ((MEM, 1, None), (REDIS, 1, redis), ("scale-2e", 2, redis)):
            cluster = stack.enter_context(_cluster(ctx, name, edges, url))
            clusters.append(cluster)
            pids = by_cluster[name] = _started(ctx, name, cluster)
            first = cluster.edges[0]
            one = Target(name, first.ports["openai"], pids, cluster.token,
                         metrics_url=first.control_url + "/metrics")  # fmt: skip
            if edges == 1:
                targets += [(one, CONCURRENCY)]
                continue
            owner = _owner(cluster, "node-1")
            other = cluster.edges[1 - owner]
            ports = tuple(h.ports["openai"] for h in cluster.edges)
            own = cluster.edges[owner]
            targets += [
                (dataclasses.replace(one, name=RR, metrics_url="", spread=ports), (16,)),
                (dataclasses.replace(
                    one, name=LOCAL, port=own.ports["openai"], bodies=CROSS_BODIES,
                    metrics_url=own.control_url + "/metrics"), CONCURRENCY),
                (dataclasses.replace(
                    one, name=CROSS, port=other.ports["openai"], bodies=CROSS_BODIES,
                    metrics_url=other.control_url + "/metrics"), CONCURRENCY),
            ]  # fmt: skip
        AT_REST.update(_at_rest(by_cluster))
        chosen = ctx.options.concurrency or CONCURRENCY
        yield [Cell(t, "json", c) for t, levels in targets for c in levels if c in chosen]
        for cluster in clusters:
            cluster.wait_idle()  # every lease released after the load (R-POOL-9)


def _at_rest(pids: dict[str, dict[str, int]]) -> dict[str, float]:
    """Each Edge's CPU ms per second over ``IDLE_S`` with no request: what the engine's timers
    (lease and Node renewals, snapshot refresh, revision poll, run-routing reader) cost."""
    edges = {f"{name}: {p}": pid for name, procs in pids.items() for p, pid in procs.items()
             if p.startswith("edge")}  # fmt: skip
    before = {name: cpu_seconds(pid) for name, pid in edges.items()}
    time.sleep(IDLE_S)
    return {name: (cpu_seconds(pid) - before[name]) * 1000 / IDLE_S for name, pid in edges.items()}


def _edge_cpu(f: Figures, key: Key) -> float:
    """Edge CPU per request summed over every Edge of the target's cluster."""
    return f.median(key, lambda r: sum(v for k, v in r.cpu_ms.items() if k.startswith("edge")))


def _node_cpu(f: Figures, key: Key) -> float:
    return f.median(key, lambda r: sum(v for k, v in r.cpu_ms.items() if k.startswith("node")))


def _pair(f: Figures, label: str, a: Key, b: Key) -> str:
    """One comparison row: req/s, p50 and CPU per request of ``a`` then ``b`` (medians)."""
    rps_a, rps_b = f.median(a, "rps"), f.median(b, "rps")
    p50_a, p50_b = f.median(a, "p50"), f.median(b, "p50")
    return (
        f"| {label} | {a[2]} | {rps_a:.0f} | {rps_b:.0f} | {rps_b / rps_a if rps_a else 0:.2f}x "
        f"| {p50_a:.2f} | {p50_b:.2f} | {p50_b - p50_a:+.2f} "
        f"| {_edge_cpu(f, a):.2f} → {_edge_cpu(f, b):.2f} "
        f"| {_node_cpu(f, a):.2f} → {_node_cpu(f, b):.2f} |"
    )


@section
def compare(f: Figures) -> list[str]:
    """Scale-out against its baselines, per cell (medians)."""
    if SKIPPED:
        return ["## Scale-out", "", f"Skipped: {SKIPPED[0]}."]
    pairs = [
        ("in memory → Redis engine, one Edge", MEM, REDIS),
        ("one Redis Edge → two (round robin)", REDIS, RR),
        ("Node's own Edge → the other Edge (routed)", LOCAL, CROSS),
    ]
    rows = [
        _pair(f, label, (a, "json", c), (b, "json", c))
        for label, a, b in pairs
        for c in CONCURRENCY
        if f.has((a, "json", c)) and f.has((b, "json", c))
    ]
    if not rows:
        return []
    rest = ", ".join(f"{name} {ms:.1f}" for name, ms in AT_REST.items())
    return [
        "## Scale-out: A → B (medians, json; every Edge and Node unpinned)",
        "",
        "CPU ms/req is summed over the Edges (and over the Nodes) of each target's cluster.",
        "",
        "| A → B | c | req/s A | req/s B | B/A | p50 ms A | p50 ms B | p50 added ms "
        "| Edge CPU ms/req | Node CPU ms/req |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Edge CPU at rest before the load, ms per second ({IDLE_S:g} s, no request; "
        f"resolution {1000 / os.sysconf('SC_CLK_TCK') / IDLE_S:.1f} ms/s): {rest}.",
    ]
