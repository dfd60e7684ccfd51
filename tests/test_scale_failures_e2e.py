"""Scale-out under failure, end to end (R-SCALE-2, R-SCALE-3, R-POOL-5, R-POOL-9): three real
Edges (runedge) on one PostgreSQL database and one Redis, two iop-node Nodes listing every
Edge, fake upstreams whose ``peak`` gauge shows what they served at once.

The Redis is a redis-server of this module's own on a free port (one test kills it and starts
it again empty); the module runs when ``IOP_TEST_DATABASE_URL`` and ``IOP_TEST_REDIS_URL``
are set, as ``.ci/run`` does. One cluster serves the module: after each test every Edge runs
again, Redis is up and the pool is idle. Times printed as ``measured:`` feed the failure
table in docs/scale-out.md."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import threading
import time
import urllib.error
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from pool.engine_redis.pool import VIEW_MAX_AGE_S
from tests.support.cluster import Cluster, scale_out_redis_url
from tests.support.processes import free_port
from tests.support.redis_pool import OwnRedis, own_redis
from tests.support.scale_failures import (
    Load,
    alive_key,
    apply_document,
    ask,
    at_once,
    client,
    eventually,
    read_pool,
    restart_edge,
    set_peak,
)
from tests.support.upstream_loop import Hold

DATABASE = os.environ.get("IOP_TEST_DATABASE_URL", "")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not DATABASE.startswith(("postgres://", "postgresql://")),
        reason="needs PostgreSQL: set IOP_TEST_DATABASE_URL=postgresql://... (Edges share it)",
    ),
    pytest.mark.skipif(
        scale_out_redis_url() is None or shutil.which("redis-server") is None,
        reason="needs IOP_TEST_REDIS_URL, a build with the Redis pool engine and run routing, "
        "and redis-server on PATH (the module runs a Redis of its own)",
    ),
]
TTL_S = 2.0  # IOP_LEASE_TTL_S of the cluster: leases, Nodes and alive keys
CAPACITY = {"a": 2, "b": 2, "one": 1}


def node(node_id: str, *providers: tuple[str, str]) -> dict[str, Any]:
    rows = [
        {"id": pid, "profile": "openai", "base_url": f"{{up:{up}}}/v1", "capacity": CAPACITY[up]}
        for pid, up in providers
    ]
    return {"id": node_id, "providers": rows}


NODES = [node("node-1", ("p-a", "a"), ("p-one", "one")), node("node-2", ("p-b", "b"))]
MODELS = [
    {"id": "gpt-test", "providers": {"p-a": "served-gpt", "p-b": "served-gpt"}},
    {"id": "gpt-one", "providers": {"p-one": "served-gpt"}},
    {"id": "gpt-b", "providers": {"p-b": "served-gpt"}},
]


def measured(what: str, seconds: float) -> None:
    print(f"measured: {what}: {seconds * 1000:.0f} ms (lease TTL {TTL_S} s)")


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnRedis]:
    with own_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def running(redis_server: OwnRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(
        tmp_path_factory.mktemp("cluster"),
        database_url=DATABASE,
        edges=3,
        redis_url=redis_server.url,
        database_prefix="iop_scale_failures",
        lease_ttl_s=TTL_S,
        upstreams={name: "openai" for name in CAPACITY},
        nodes=NODES,
        models=MODELS,
        pool={"max_queue": 100},
    ) as started:
        assert started.chat(0)[0] == 200  # past the fresh prefix's recovery grace
        yield started
    atexit.unregister(started.stop)  # stopped already; its Redis is gone by exit


def clear(cluster: Cluster) -> None:
    cluster.reset_upstreams()
    for name in CAPACITY:
        set_peak(cluster, name)


@pytest.fixture
def cluster(running: Cluster, redis_server: OwnRedis) -> Iterator[Cluster]:
    """The module's cluster, its upstreams' records and gauges cleared; afterwards Redis and
    every Edge run again and the pool is idle."""
    clear(running)
    yield running
    if redis_server.proc is None:
        redis_server.start()
    for handle in running.edges:
        if not handle.alive():
            restart_edge(running, handle.index)
    clear(running)
    running.wait_online()
    eventually(
        lambda: read_pool(running).idle(),
        "the shared pool idle after the test",
        state=lambda: read_pool(running),
    )


def stream(cluster: Cluster, index: int, model: str, text: str) -> BaseException | None:
    """A streamed completion through Edge ``index`` read to its end: the error, if any."""
    try:
        with client(cluster, index) as sdk:
            chunks = sdk.chat.completions.create(
                model=model, messages=[{"role": "user", "content": text}], stream=True
            )
            for _ in chunks:
                pass
    except Exception as exc:  # what the client saw is the test's subject
        return exc
    return None


def start(target: Any, *args: Any) -> tuple[threading.Thread, list[Any]]:
    """``target(*args)`` on a thread; its result lands in the returned list."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(target(*args)), daemon=True)
    thread.start()
    return thread, out


def pool_read(cluster: Cluster, index: int) -> int:
    """The status of ``GET /pool`` on Edge ``index``'s control listener."""
    try:
        cluster.edges[index].pool_snapshot()
    except urllib.error.HTTPError as exc:
        assert json.loads(exc.read())["error"]["code"] == "pool_unavailable"
        return exc.code
    return 200


def in_upstreams(cluster: Cluster, *names: str) -> int:
    return sum(cluster.upstream(name).server.current for name in names)


def served_texts(cluster: Cluster, name: str) -> list[str]:
    return [r.json["messages"][-1]["content"] for r in cluster.upstream(name).server.requests]


def test_runs_stay_on_the_asking_edges_own_node_when_loads_tie_r_scale_5(cluster):
    """R-SCALE-5: gpt-test is p-a (node-1) or p-b (node-2), equal in priority. Asked one at a
    time (loads tie at 0), an Edge holding exactly one of the Nodes serves every run on it
    (no routed run); an Edge holding both or neither alternates (round robin)."""
    local: dict[int, list[str]] = {h.index: [] for h in cluster.edges}
    for node_id, name in (("node-1", "a"), ("node-2", "b")):
        at = cluster.edge_of(node_id)
        assert at is not None, node_id
        local[at].append(name)
    assert any(len(names) == 1 for names in local.values()), local

    def served_by(index: int, runs: int) -> list[str]:
        before = {name: len(cluster.upstream(name).server.requests) for name in ("a", "b")}
        out = []
        for i in range(runs):
            assert ask(cluster, index, "gpt-test", f"local {index} {i}")[0] == 200
            now = {name: len(cluster.upstream(name).server.requests) for name in ("a", "b")}
            out += [name for name in now if now[name] > before[name]]
            before = now
        return out

    for index, names in local.items():
        expected = names * 6 if len(names) == 1 else ["a"] * 3 + ["b"] * 3
        assert sorted(served_by(index, 6)) == expected, (index, names)


def test_sixty_requests_over_three_edges_are_answered_within_capacity_r_scale_2(cluster):
    for name in ("a", "b"):
        cluster.upstream(name).server.faults.stall_before_first_byte = 0.05
    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(lambda i: ask(cluster, i % 3, "gpt-test", f"n{i}"), range(60)))
    assert [status for status, _ in results] == [200] * 60, results
    served = {name: len(cluster.upstream(name).server.requests) for name in ("a", "b")}
    assert sum(served.values()) == 60 and all(served.values()), served
    for name in ("a", "b"):  # R-SCALE-2: one capacity for all Edges
        assert 1 <= cluster.upstream(name).server.peak <= CAPACITY[name]
    # R-POOL-9: every lease released once, nothing queued, read from Redis itself.
    eventually(lambda: read_pool(cluster).idle(), "no lease, waiter or count left in Redis")


def test_waiters_queued_on_three_edges_are_served_in_the_order_they_queued_r_pool_5(cluster):
    """Capacity 1 held; nine waiters queued on alternating Edges, each confirmed in the
    Redis queue before the next; then released: the upstream sees them in queue order."""
    hold = Hold(cluster.upstream("one"))
    first, _ = start(stream, cluster, 0, "gpt-one", "fifo 0")
    hold.wait_streaming()
    waiters = []
    for i in range(1, 10):
        waiters.append(start(ask, cluster, i % 3, "gpt-one", f"fifo {i}"))
        eventually(lambda i=i: read_pool(cluster).queued == i, f"waiter {i} queued")
    hold.release()
    for thread, _ in [*waiters, (first, None)]:
        thread.join(30)
    assert [out[0][0] for _, out in waiters] == [200] * 9, waiters
    assert served_texts(cluster, "one") == [f"fifo {i}" for i in range(10)]
    assert cluster.upstream("one").server.peak == 1


def test_an_edge_killed_mid_stream_loses_no_capacity_and_its_node_moves_r_scale_3(cluster):
    victim = cluster.edge_of("node-1")
    assert victim is not None
    others = [h.index for h in cluster.edges if h.index != victim]
    holds = [Hold(cluster.upstream("a")), Hold(cluster.upstream("b"))]
    streams = [start(stream, cluster, victim, "gpt-test", f"k{i}") for i in range(4)]
    eventually(lambda: in_upstreams(cluster, "a", "b") == 4, "all capacity streaming")
    killed = time.monotonic()
    cluster.kill_edge(victim)  # SIGKILL: nothing released, nothing said to the Nodes
    for thread, out in streams:
        thread.join(30)
        # The client of the dead Edge sees a broken connection, which it may retry.
        assert isinstance(out[0], (openai.APIConnectionError, httpx.TransportError)), out
    moved = eventually(
        lambda: (
            cluster.edge_of("node-1") not in (None, victim)
            and read_pool(cluster).nodes.get("node-1")
            == cluster.edges[cluster.edge_of("node-1") or 0].edge_id
        ),
        "node-1 ready on another Edge",
    )
    measured("Edge SIGKILL -> its Node ready on another Edge", moved)
    eventually(lambda: in_upstreams(cluster, "a", "b") == 0, "the dead Edge's runs ended")
    measured("Edge SIGKILL -> its runs ended on the Nodes", time.monotonic() - killed)
    eventually(lambda: read_pool(cluster).idle(), "the dead Edge's leases expired")
    measured("Edge SIGKILL -> its leases free", time.monotonic() - killed)
    for hold in holds:
        hold.release()
    # The whole capacity (2 + 2) is there again, from the two live Edges.
    for name in ("a", "b"):
        set_peak(cluster, name)
    holds = [Hold(cluster.upstream("a")), Hold(cluster.upstream("b"))]
    again = [start(stream, cluster, others[i % 2], "gpt-test", f"again {i}") for i in range(4)]
    eventually(lambda: in_upstreams(cluster, "a", "b") == 4, "all capacity streaming again")
    for hold in holds:
        hold.release()
    for thread, out in again:
        thread.join(30)
        assert out == [None]
    assert [cluster.upstream(name).server.peak for name in ("a", "b")] == [2, 2]


def test_a_waiter_is_served_after_the_edge_holding_the_only_lease_is_killed_r_pool_9(cluster):
    owner = cluster.edge_of("node-1")  # where p-one's Node is connected
    holder, waiter = [h.index for h in cluster.edges if h.index != owner]
    hold = Hold(cluster.upstream("one"))
    held, _ = start(stream, cluster, holder, "gpt-one", "held")
    hold.wait_streaming()
    waiting, answer = start(ask, cluster, waiter, "gpt-one", "waiting")
    eventually(lambda: read_pool(cluster).queued == 1, "the waiter queued")
    killed = time.monotonic()
    cluster.kill_edge(holder)
    waiting.join(30)
    measured("Edge SIGKILL -> a waiter on another Edge gets its lease", time.monotonic() - killed)
    assert answer == [(200, answer[0][1])], answer
    hold.release()
    held.join(30)
    assert cluster.upstream("one").server.peak == 1  # never both at once (R-SCALE-2)


def test_a_paused_edge_resumed_after_its_id_was_taken_cannot_serve_r_scale_4(cluster):
    """R-SCALE-4: an Edge with a routed run on the capacity-1 provider is SIGSTOPped; once its
    alive key expired a new process takes its id (a supervisor's restart loop). The Edge
    serving the run cancels it, the capacity goes to the new process, and the old process,
    resumed, is refused, says so in one line and exits 1: the upstream never serves two."""
    owner = cluster.edge_of("node-1")  # where p-one's Node is connected
    victim = next(h.index for h in cluster.edges if h.index != owner)
    hold = Hold(cluster.upstream("one"))
    held, seen = start(stream, cluster, victim, "gpt-one", "paused")
    hold.wait_streaming()
    old = cluster.edges[victim].proc
    assert old is not None and old.popen is not None
    old.popen.send_signal(signal.SIGSTOP)
    paused = time.monotonic()
    handle = cluster.edges[victim]
    ports = handle.ports
    try:
        eventually(lambda: in_upstreams(cluster, "one") == 0, "the paused run cancelled")
        measured("Edge SIGSTOP -> its routed run cancelled", time.monotonic() - paused)
        handle.proc = None  # the old process stays, paused, outside the cluster
        handle.ports = {role: free_port() for role in ports}  # it still holds its own
        restart_edge(cluster, victim)  # the same id, once the old alive key expired
        measured("Edge SIGSTOP -> its id taken by a new process", time.monotonic() - paused)
        hold.release()
        assert ask(cluster, victim, "gpt-one", "new process")[0] == 200
    finally:
        old.popen.send_signal(signal.SIGCONT)
    resumed = time.monotonic()
    eventually(lambda: not old.alive(), "the fenced process exited")
    measured("SIGCONT -> the fenced process exited", time.monotonic() - resumed)
    assert old.popen.returncode == 1
    assert "taken over by a newer process" in old.log.read_text(errors="replace")
    held.join(30)
    # Its client saw the run end (a broken connection or a retryable 503), never an answer nor
    # an upstream error: the upstream did nothing wrong.
    assert seen and seen[0] is not None
    assert not (isinstance(seen[0], openai.APIStatusError) and seen[0].status_code == 502), seen
    assert ask(cluster, victim, "gpt-one", "after")[0] == 200  # the new process serves
    assert cluster.upstream("one").server.peak == 1
    assert alive_key(cluster, victim)
    cluster.kill_edge(victim, signal.SIGTERM)  # back on the ports its Nodes know
    handle.ports = ports
    restart_edge(cluster, victim)


def test_a_read_of_the_pool_is_never_older_than_its_bound_r_scale_8(cluster):
    """R-SCALE-8: Edge 1 reads in_flight 2 while two runs of Edge 0 stream; they end. Once
    Redis has their releases and the bound (250 ms) has passed, Edge 1's first ``/pool`` read
    answers 0: it reads Redis first instead of answering its old view."""

    def in_flight(index: int) -> int:
        return sum(row["in_flight"] for row in cluster.edges[index].pool_snapshot()["providers"])

    holds = [Hold(cluster.upstream("a")), Hold(cluster.upstream("b"))]
    runs = [start(stream, cluster, 0, "gpt-test", f"v{i}") for i in range(2)]
    eventually(lambda: sum(read_pool(cluster).in_flight.values()) == 2, "two runs streaming")
    time.sleep(VIEW_MAX_AGE_S)  # a view read before they started may be answered until then
    try:
        assert in_flight(1) == 2
    finally:
        for hold in holds:
            hold.release()
    for thread, out in runs:
        thread.join(30)
        assert out == [None]
    eventually(lambda: read_pool(cluster).idle(), "both released in Redis")
    time.sleep(VIEW_MAX_AGE_S)  # the bound under test: Edge 1's view is now older than it
    assert in_flight(1) == 0
    for name in ("a", "b"):
        assert cluster.upstream(name).server.peak <= CAPACITY[name]


def test_redis_restarted_empty_under_load_is_a_clear_503_and_never_over_admits_r_scale_3(
    cluster, redis_server
):
    for name in ("a", "b"):
        cluster.upstream(name).server.faults.stall_before_first_byte = 0.05
    with Load(cluster, edges=3) as load:
        results = load.results
        eventually(lambda: sum(r[3] == 200 for r in results) >= 12, "load running")
        killed = time.monotonic()
        redis_server.kill()
        gone = time.monotonic()  # the process has exited: no read is answered after this
        eventually(
            lambda: any(r[4] == "pool_unavailable" for r in results if r[0] > killed),
            "a 503 pool_unavailable while Redis is gone",
        )
        # R-SCALE-8: no view older than its bound while Redis is gone. A view read just
        # before the kill may be answered until the bound has passed: the bound under test.
        time.sleep(max(0.0, gone + VIEW_MAX_AGE_S - time.monotonic()))
        assert pool_read(cluster, 0) == 503
        redis_server.start()  # on the same port, empty: a new epoch
        back = time.monotonic()
        for index in range(3):
            eventually(
                lambda index=index: any(
                    r[0] > back and r[2] == index and r[3] == 200 for r in results
                ),
                f"edge-{index} answering again",
            )
        measured("Redis restart -> every Edge answers 200 again", time.monotonic() - back)
    # Refused while Redis is gone or recovering: the two clear codes; a routed run whose relay
    # lost Redis is a 503 pool_unavailable too (docs/scale-out.md). A run started once Redis
    # was back never fails as upstream_error: the upstream did nothing wrong.
    failed = {(r[3], r[4]) for r in results if r[1] > killed and r[3] != 200}
    assert failed <= {(503, "pool_unavailable"), (503, "pool_recovering")}, failed
    after = [r for r in results if r[0] > back]
    assert after and all(r[3] in (200, 503) for r in after), after
    assert all(r[3] != 0 for r in results)  # none hung until the client gave up
    for name in ("a", "b"):
        assert cluster.upstream(name).server.peak <= CAPACITY[name]
    eventually(lambda: read_pool(cluster).idle(), "nothing left in the new Redis")


def test_a_node_that_flaps_between_edges_settles_ready_on_exactly_one_r_scale_3(cluster):
    for _ in range(3):  # the Edge it is on dies, it moves, the Edge comes back
        at = cluster.edge_of("node-2")
        assert at is not None
        cluster.kill_edge(at)
        took = eventually(lambda at=at: cluster.edge_of("node-2") not in (None, at), "moved")
        measured("Node flap -> ready on the next Edge", took)
        restart_edge(cluster, at)
    settled = cluster.edge_of("node-2")
    assert settled is not None
    eventually(
        lambda: read_pool(cluster).nodes.get("node-2") == cluster.edges[settled].edge_id,
        "Redis names the Edge the Node is connected to",
    )
    for index in range(3):
        assert ask(cluster, index, "gpt-b", f"after flap {index}")[0] == 200
    for handle in cluster.edges:  # every Edge, restarted or not, sees p-b through Redis
        assert alive_key(cluster, handle.index)
        eventually(  # an Edge's /pool view is refreshed from Redis (docs/scale-out.md)
            lambda handle=handle: (
                [
                    row["online"]
                    for row in handle.pool_snapshot()["providers"]
                    if row["provider_id"] == "p-b"
                ]
                == [True]
            ),
            f"p-b online on {handle.edge_id}",
        )
    eventually(lambda: read_pool(cluster).idle(), "counters back to zero")


def test_two_applies_at_once_leave_one_active_revision_on_every_edge_r_scale_3(cluster):
    """Edges 0 and 1 apply at the same moment; all three Edges and the Redis policy end on
    the one active revision (bound: IOP_REVISION_POLL_S + load, docs/scale-out.md)."""
    import psycopg
    import yaml

    documents = []
    for timeout_ms in (30001, 30002):
        document = yaml.safe_load(cluster.config_path.read_text())
        document["provider_pool"]["queue_timeout_ms"] = timeout_ms
        documents.append(document)
    results = at_once(
        lambda: apply_document(cluster.edges[0].control_url, documents[0]),
        lambda: apply_document(cluster.edges[1].control_url, documents[1]),
    )
    assert [status for status, _ in results] == [200, 200], results
    with psycopg.connect(cluster.database_url) as db:
        [(active,)] = db.execute("SELECT id FROM refresh_configrevision WHERE is_active").fetchall()
    assert active == max(report["revision"] for _, report in results)
    took = eventually(
        lambda: (
            all(h.pool_snapshot()["revision"] == active for h in cluster.edges)
            and read_pool(cluster).policy_version == active
        ),
        "every Edge and the Redis policy on the active revision",
    )
    measured("two applies at once -> every Edge on the active revision", took)
