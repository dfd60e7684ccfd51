"""`make bench --baseline REV`: another revision's Edge and Node run beside this one's, from a
worktree of that revision (docs/performance.md, "What a change bought")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench_cells
import pytest

from tests.support.processes import ROOT
from tests.support.stack import Stack


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout: no revisions")
def test_a_baseline_is_a_worktree_of_that_revision_made_once(tmp_path: Path) -> None:
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        short, root = bench_cells.baseline_checkout("HEAD", under=tmp_path)
        assert (short, root) == (head[:12], tmp_path / head[:12])
        checked_out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        assert checked_out == head and (root / "manage.py").exists()
        (root / "marker").write_text("kept")
        assert bench_cells.baseline_checkout(head, under=tmp_path) == (short, root)
        assert (root / "marker").read_text() == "kept"  # the worktree is reused, not remade
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tmp_path / head[:12])],
                       cwd=ROOT, capture_output=True)  # fmt: skip


def test_a_stack_from_another_checkout_starts_its_processes_there(tmp_path: Path) -> None:
    """The Edge and the Node start in ``root`` with it first on their path."""
    stack = Stack(tmp_path / "stack", upstreams={}, root=tmp_path)
    node = stack._node_proc("node-1", {})
    assert node.cwd == tmp_path and node.env["PYTHONPATH"] == str(tmp_path)
    assert stack._edge_env()["PYTHONPATH"] == str(tmp_path)
