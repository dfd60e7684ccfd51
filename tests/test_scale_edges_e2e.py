"""Several Edges, end to end (R-SCALE-2, R-SCALE-3): real runedge and iop-node processes on
loopback, one PostgreSQL database (``IOP_TEST_DATABASE_URL``), per-Edge ports from the
runedge flags.

With ``IOP_TEST_REDIS_URL`` and a build that has the Redis pool engine and run routing, the
Edges run in scale-out mode; otherwise each runs its own in-memory pool, which is all these
tests need: a Node moving to another Edge, and revisions written by two Edges at once."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cluster import Cluster, scale_out_redis_url, with_database
from tests.support.config import provider
from tests.support.processes import EDGE_YAML, ROOT, child_env, free_port, migrated_template
from tests.support.scale_failures import apply_document, at_once

DATABASE = os.environ.get("IOP_TEST_DATABASE_URL", "")
needs_postgres = pytest.mark.skipif(
    not DATABASE.startswith(("postgres://", "postgresql://")),
    reason="needs PostgreSQL: set IOP_TEST_DATABASE_URL=postgresql://... (Edges share it)",
)
pytestmark = pytest.mark.slow
SCALE_OUT_SKIP = "scale-out needs Redis: set IOP_TEST_REDIS_URL=redis://..."


@pytest.fixture
def own_cluster(tmp_path: Path):
    """A cluster of the test's own, for a test that kills one of its Edges."""
    with Cluster(
        tmp_path, database_url=DATABASE, edges=2, redis_url=scale_out_redis_url()
    ) as running:
        yield running


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """One cluster for the tests that leave both Edges running: each applies capacities no
    other test applies, so none finds its document already active."""
    with Cluster(
        tmp_path_factory.mktemp("shared"),
        database_url=DATABASE,
        edges=2,
        redis_url=scale_out_redis_url(),
    ) as running:
        yield running


def active_revisions(cluster: Cluster) -> list[tuple[int, int | None]]:
    import psycopg

    with psycopg.connect(cluster.database_url) as db:
        rows = db.execute(
            "SELECT id, parent_id FROM refresh_configrevision WHERE is_active"
        ).fetchall()
    return [(row[0], row[1]) for row in rows]


def capacity_document(cluster: Cluster, capacity: int) -> dict[str, Any]:
    document = yaml.safe_load(cluster.config_path.read_text())
    provider(document, "p-openai")["capacity"] = capacity
    return document


@needs_postgres
def test_a_node_moves_to_the_next_edge_when_its_edge_is_killed_r_scale_3(own_cluster):
    assert own_cluster.edge_of("node-1") == 0  # the first Node starts at the first Edge
    own_cluster.kill_edge(0)  # SIGKILL: no goodbye on the wire
    deadline = time.monotonic() + 30
    while own_cluster.edge_of("node-1") != 1:
        assert time.monotonic() < deadline, own_cluster.logs()[-4000:]
        time.sleep(0.05)
    status, body = own_cluster.chat(1)
    assert status == 200 and body["choices"], body


@needs_postgres
@pytest.mark.skipif(scale_out_redis_url() is None, reason=SCALE_OUT_SKIP)
def test_an_apply_on_one_edge_is_active_on_the_other_within_the_poll_bound_r_scale_3(cluster):
    status, report = apply_document(
        cluster.edges[0].control_url, capacity_document(cluster, 3), None
    )
    assert status == 200, report
    deadline = time.monotonic() + 30
    while cluster.edges[1].pool_snapshot()["revision"] != report["revision"]:
        assert time.monotonic() < deadline, cluster.logs()[-4000:]
        time.sleep(0.05)
    # The pool's figures on /pool come from the Edge's view of Redis, at most 250 ms old.
    while [row["capacity"] for row in cluster.edges[1].pool_snapshot()["providers"]] != [3]:
        assert time.monotonic() < deadline, cluster.logs()[-4000:]
        time.sleep(0.05)
    assert "installed in" in (cluster.dir / "edge-1.log").read_text()


@needs_postgres
def test_two_applies_on_the_same_parent_on_two_edges_at_once_one_wins_r_scale_3(cluster):
    [(parent, _)] = active_revisions(cluster)
    first, second = cluster.edges
    results = at_once(
        lambda: apply_document(first.control_url, capacity_document(cluster, 6), parent),
        lambda: apply_document(second.control_url, capacity_document(cluster, 7), parent),
    )
    statuses = sorted(status for status, _ in results)
    assert statuses == [200, 409], results
    won = next(report for status, report in results if status == 200)
    lost = next(report for status, report in results if status == 409)
    assert lost["outcome"] == "refused_stale_parent" and lost["active"] == won["revision"]
    assert active_revisions(cluster) == [(won["revision"], parent)]


@needs_postgres
def test_two_applies_without_a_parent_on_two_edges_at_once_apply_one_on_top_of_the_other(
    cluster,
):
    [(start, _)] = active_revisions(cluster)
    first, second = cluster.edges
    results = at_once(
        lambda: apply_document(first.control_url, capacity_document(cluster, 8), None),
        lambda: apply_document(second.control_url, capacity_document(cluster, 9), None),
    )
    assert [status for status, _ in results] == [200, 200], results
    revisions = sorted(report["revision"] for _, report in results)
    # Serialized: the later one was built on the earlier one, and only it is active.
    assert active_revisions(cluster) == [(revisions[1], revisions[0])]
    parents = {report["revision"]: report["parent"] for _, report in results}
    assert parents == {revisions[0]: start, revisions[1]: revisions[0]}


def run_edge(
    tmp_path: Path, config: Path, *flags: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "manage.py", "runedge", "--config", str(config), *flags],
        cwd=ROOT,
        env=child_env(
            {
                "DATABASE_URL": f"sqlite:///{tmp_path / 'edge.sqlite3'}",
                "IOP_VAR_DIR": str(tmp_path),
                **(env or {}),
            }
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def ready_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the ready line, or "" when the Edge exited
    if not line:
        assert proc.stderr is not None
        raise AssertionError(proc.stderr.read())
    return line


def stopped(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    return err


def test_listen_flags_and_variables_move_the_listeners_but_keep_the_shared_revision(tmp_path):
    shutil.copyfile(migrated_template(), tmp_path / "edge.sqlite3")
    document = yaml.safe_load(EDGE_YAML.read_text())
    document["edge"].update(listen=f"127.0.0.1:{free_port()}", bootstrap_dir=str(tmp_path / "b"))
    document["admin"]["listen"] = f"127.0.0.1:{free_port()}"
    document["openai"]["listen"] = f"127.0.0.1:{free_port()}"
    config = tmp_path / "edge.yaml"
    config.write_text(yaml.safe_dump(document))
    edge, openai, admin = free_port(), free_port(), free_port()
    proc = run_edge(
        tmp_path,
        config,
        *("--edge-listen", f"127.0.0.1:{edge}", "--admin-listen", f"127.0.0.1:{admin}"),
        env={"IOP_OPENAI_LISTEN": f"127.0.0.1:{openai}", "IOP_ADMIN_LISTEN": "127.0.0.1:1"},
    )
    try:
        line = ready_line(proc)
        assert f"edge=ws://127.0.0.1:{edge}" in line and f"admin=http://127.0.0.1:{admin}" in line
        assert f"openai=http://127.0.0.1:{openai}" in line
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/pool", timeout=5) as response:
            first_revision = json.loads(response.read())["revision"]
    finally:
        err = stopped(proc)
    assert f"revision {first_revision} is now active" in err
    again = run_edge(tmp_path, config, "--admin-listen", f"127.0.0.1:{free_port()}")
    try:
        ready_line(again)
    finally:
        err = stopped(again)
    # The same document: no new revision, whatever this Edge listens on.
    assert f"starting with revision {first_revision}" in err and "is now active" not in err


def test_scale_out_on_sqlite_refuses_to_start_with_the_reason(tmp_path):
    shutil.copyfile(migrated_template(), tmp_path / "edge.sqlite3")
    proc = run_edge(tmp_path, EDGE_YAML, env={"IOP_REDIS_URL": "redis://127.0.0.1:1/0"})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "IOP Edge ready" not in out
    assert "cannot start: scale-out (IOP_REDIS_URL is set) needs every Edge on one" in err


REDIS = os.environ.get("IOP_TEST_REDIS_URL", "")


@needs_postgres
@pytest.mark.skipif(not REDIS, reason="needs Redis: set IOP_TEST_REDIS_URL=redis://...")
def test_a_second_edge_with_the_id_of_a_live_one_is_refused(tmp_path):
    """The id is taken while its alive key exists (docs/scale-out.md)."""
    import psycopg
    import redis

    prefix = f"iop-se-{secrets.token_hex(4)}"
    database = f"iop_scale_edges_{secrets.token_hex(4)}"
    client = redis.Redis.from_url(REDIS)
    admin = with_database(DATABASE, "postgres")
    with psycopg.connect(admin, autocommit=True) as db:
        db.execute(f'CREATE DATABASE "{database}"')  # type: ignore[arg-type]
    try:
        env = {"DATABASE_URL": with_database(DATABASE, database), "IOP_VAR_DIR": str(tmp_path)}
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0", "--skip-checks"],
            cwd=ROOT,
            env=child_env(env),
            check=True,
            capture_output=True,
            timeout=180,
        )
        client.set(f"{prefix}:alive:edge-a", "1", px=60_000)  # a live Edge holds "edge-a"
        done = subprocess.run(
            [sys.executable, "manage.py", "runedge", "--config", str(EDGE_YAML)],
            cwd=ROOT,
            env=child_env(
                env | {"IOP_REDIS_URL": REDIS, "IOP_REDIS_PREFIX": prefix, "IOP_EDGE_ID": "edge-a"}
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        client.delete(f"{prefix}:alive:edge-a")
        client.close()
        with psycopg.connect(admin, autocommit=True) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')  # type: ignore[arg-type]
    assert done.returncode == 1 and "IOP Edge ready" not in done.stdout
    assert "another Edge with id 'edge-a' is alive" in done.stderr


@needs_postgres
@pytest.mark.skipif(scale_out_redis_url() is None, reason=SCALE_OUT_SKIP)
def test_a_run_asked_on_one_edge_reaches_the_node_on_another_r_scale_2(cluster):
    assert cluster.edge_of("node-1") == 0
    status, body = cluster.chat(1)
    assert status == 200 and body["choices"][0]["message"]["content"], body


@needs_postgres
@pytest.mark.skipif(scale_out_redis_url() is None, reason=SCALE_OUT_SKIP)
def test_capacity_is_exact_across_edges_r_scale_2(tmp_path):
    """Capacity 1, four requests at once through two Edges: the upstream never serves two."""
    one = [{"id": "p-openai", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 1}]
    with Cluster(
        tmp_path, database_url=DATABASE, edges=2, redis_url=scale_out_redis_url(), providers=one
    ) as cluster:
        assert cluster.chat(0)[0] == 200  # the fresh shared pool admits
        cluster.upstream().server.faults.stall_before_first_byte = 0.5
        results = at_once(*(lambda i=i: cluster.chat(i % 2) for i in range(4)))
        assert [status for status, _ in results] == [200] * 4, results
        assert cluster.upstream().server.peak == 1
