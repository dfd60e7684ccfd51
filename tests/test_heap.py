"""The collector around a process's start (nodes/heap.py; docs/testing.md "Cheaper
start-ups"): held while the Edge and the Node load and build, on again once the heap is
settled, however the start ends; a running Edge and Node collect as any process does."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodes.heap import collector_paused, settle_heap
from tests.support import Stack
from tests.support.processes import ROOT


@pytest.fixture
def collector_on() -> Iterator[None]:
    """The collector on and nothing frozen, before and after."""
    gc.enable()
    gc.unfreeze()
    yield
    gc.enable()
    gc.unfreeze()


def test_a_paused_block_holds_the_collector_and_restores_it_however_it_ends(collector_on):
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(SystemExit), collector_paused():
        raise SystemExit(2)  # a start refused inside the block
    assert gc.isenabled()
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()  # a collector that was off stays off


def test_settling_the_heap_inside_a_paused_block_turns_the_collector_on(collector_on):
    with collector_paused():
        frozen = settle_heap()
        assert gc.isenabled()
    assert gc.isenabled()
    assert frozen > 0


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
def test_a_started_edge_and_node_collect_on_their_own(tmp_path: Path):
    """While they serve, the Edge and its Node make the collector's young-generation passes
    themselves (nothing in them asks for one: settling the heap is one full pass), read
    before they stop (tests/support/gc_probe)."""
    probe = ROOT / "tests" / "support" / "gc_probe"
    env = {"PYTHONPATH": f"{probe}:{ROOT}", "IOP_TEST_GC_PASSES": str(tmp_path / "gc")}
    with Stack(tmp_path / "stack", env=env) as stack:
        for _ in range(20):
            assert stack.chat_status("gpt-test") == 200
        passes = {
            path.name.split(".")[1]: path.read_text().split() for path in tmp_path.glob("gc.*")
        }
    assert sorted(passes) == ["edge", "node"], passes
    for role, generations in passes.items():
        assert "0" in generations, (role, generations)
