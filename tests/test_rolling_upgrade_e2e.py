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

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout: no revisions"),
]


@pytest.fixture(scope="module")
def older(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    known = subprocess.run(["git", "cat-file", "-e", f"{OLDER_NODE}^{{commit}}"], cwd=ROOT)
    if known.returncode != 0:
        pytest.skip(f"commit {OLDER_NODE[:12]} is not in this clone (a shallow one?)")
    _, root = bench_cells.baseline_checkout(OLDER_NODE, under=tmp_path_factory.mktemp("older"))
    try:
        yield root
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(root)], cwd=ROOT, check=False)


def test_this_edge_serves_through_a_node_of_the_previous_protocol_r_ha_4(older, tmp_path):
    with Stack(tmp_path, node_root=older) as stack:
        assert [stack.chat_status("gpt-test") for _ in range(3)] == [200, 200, 200]
        conn = stack.send_chat("gpt-test", stream=True)
        try:
            streamed = conn.getresponse()
            assert streamed.status == 200 and b"data: [DONE]" in streamed.read()
        finally:
            conn.close()
        assert "unknown field" not in stack.logs()
