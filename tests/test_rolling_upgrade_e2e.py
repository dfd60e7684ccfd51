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

from tests.support.processes import ROOT
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
    with Stack(tmp_path, root=older["edge"], node_root=ROOT) as stack:
        served(stack)
