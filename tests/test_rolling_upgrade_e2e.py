"""Rolling upgrades (R-HA-4, docs/scale-out.md "Rolling upgrades"): this Edge with the Node
of an earlier commit (a git worktree, as ``make bench --baseline`` makes one), real
processes. The earlier Node speaks protocol 1 and predates ``request_id`` / ``traceparent``
on run requests; it refuses any field it does not know, so the Edge must send it only what
its protocol has (``nodes.wire.FIELDS_SINCE``)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench_cells
import pytest

from tests.support.cluster import Cluster, postgres_test_url, scale_out_redis_url
from tests.support.processes import ROOT
from tests.support.scale_failures import Load, eventually, read_pool
from tests.support.stack import Stack

# The last commit before run requests carried request_id and traceparent (a protocol 1 Node).
OLDER_NODE = "11f3efe1f476c6c53866343662a79774b34c2215"
# The last commit before versions met at register (protocol 2, no FIELDS_SINCE).
OLDER_EDGE = "f44a587e72560ccba7199539c7c6466d45fdf1d3"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout: no revisions"),
]


def checkout(commit: str, under: Path) -> Path:
    known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT)
    if known.returncode != 0:
        pytest.skip(f"commit {commit[:12]} is not in this clone (a shallow one?)")
    return bench_cells.baseline_checkout(commit, under=under)[1]


@pytest.fixture(scope="module")
def older(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    under = tmp_path_factory.mktemp("older")
    roots: dict[str, Path] = {}
    try:
        yield {
            name: roots.setdefault(name, checkout(commit, under))
            for name, commit in (("node", OLDER_NODE), ("edge", OLDER_EDGE))
        }
    finally:
        for root in roots.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(root)], cwd=ROOT)


def served(stack: Stack) -> None:
    """Plain and streamed answers, and no frame refused on either side."""
    assert [stack.chat_status("gpt-test") for _ in range(3)] == [200, 200, 200]
    conn = stack.send_chat("gpt-test", stream=True)
    try:
        streamed = conn.getresponse()
        assert streamed.status == 200 and b"data: [DONE]" in streamed.read()
    finally:
        conn.close()
    assert "unknown field" not in stack.logs() and "protocol" not in stack.logs()


def test_this_edge_serves_through_a_node_of_the_previous_protocol_r_ha_4(older, tmp_path):
    with Stack(tmp_path, node_root=older["node"]) as stack:
        served(stack)


def test_the_previous_edge_serves_through_this_node_r_ha_4(older, tmp_path):
    """That Edge does not choose this Node's wire subprotocol: the Node registers with
    protocol 2 and sends no field of 3 (a run's cached input tokens, R-COST-1)."""
    with Stack(tmp_path, root=older["edge"], node_root=ROOT) as stack:
        served(stack)


@pytest.mark.skipif(
    not postgres_test_url().startswith("postgres") or scale_out_redis_url() is None,
    reason="needs IOP_TEST_DATABASE_URL and IOP_TEST_REDIS_URL (Edges share them)",
)
def test_two_edges_of_adjacent_commits_share_one_redis_within_capacity_r_ha_4(older, tmp_path):
    """A rolling restart half done: Edge 0 of this commit, Edge 1 of the previous one, one
    Redis, one Node each; load through both, runs routed between them; the upstreams never
    above capacity, nothing left in Redis after."""
    cluster = Cluster(
        tmp_path,
        database_url=postgres_test_url(),
        edges=2,
        redis_url=scale_out_redis_url(),
        database_prefix="iop_rolling",
        upstreams={"a": "openai", "b": "openai"},
        nodes=[node("node-a", "a"), node("node-b", "b")],
        models=[{"id": "gpt-test", "providers": {"p-a": "served-gpt", "p-b": "served-gpt"}}],
        pool={"max_queue": 100},
    )
    cluster.edges[1].root = older["edge"]
    with cluster:
        assert cluster.chat(0)[0] == 200 and cluster.chat(1)[0] == 200  # past the grace
        for name in ("a", "b"):
            cluster.upstream(name).server.faults.stall_before_first_byte = 0.05
        with Load(cluster, edges=2) as load:
            eventually(lambda: sum(r[3] == 200 for r in load.results) >= 40, "load served")
        assert {(r[2], r[3]) for r in load.results} == {(0, 200), (1, 200)}, load.results
        for name in ("a", "b"):
            assert 0 < cluster.upstream(name).server.peak <= 2
        eventually(lambda: read_pool(cluster).idle(), "nothing left in Redis")


def node(node_id: str, upstream: str) -> dict[str, object]:
    provider = {"id": f"p-{upstream}", "profile": "openai", "base_url": f"{{up:{upstream}}}/v1",
                "capacity": 2}  # fmt: skip
    return {"id": node_id, "providers": [provider]}
