"""The README's newcomer path, run as written in a copy of the checkout's tracked files:
``make run``, the README's request with the token it printed, then export what runs and
dry-run it (tests.support.quickstart lists what the test changes: the ports, and the copy
gets this checkout's ``.venv``). ``make test`` is what CI runs (``.ci/run``); the README's
``iop_node add`` runs last (it stages a change)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import yaml

from tests.support import ROOT
from tests.support.journeys import doc_blocks, printed_json, wait_for
from tests.support.quickstart import Quickstart, command_of, make_run

pytestmark = pytest.mark.slow

BLOCKS = doc_blocks(ROOT / "README.md", "readme")


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Quickstart]:
    with make_run(tmp_path_factory.mktemp("readme"), command_of(BLOCKS["run"])) as running:
        yield running


def test_make_run_prints_an_admin_password_and_a_token_that_the_readmes_request_uses(
    quickstart: Quickstart,
) -> None:
    assert re.search(r"^Admin login: admin / \S+", quickstart.log(), re.MULTILINE)
    wait_for(lambda: quickstart.provider_online("echo-cli"), 60, "the local Node online",
             log=quickstart.log)  # fmt: skip
    (answer,) = printed_json(quickstart.run(BLOCKS["first-request"]))
    assert answer["object"] == "chat.completion"
    assert "hello" in answer["choices"][0]["message"]["content"]


def test_exporting_what_runs_and_dry_running_it_shows_no_change(quickstart: Quickstart) -> None:
    (report,) = printed_json(quickstart.run(BLOCKS["export-dry-run"]))
    assert report["outcome"] == "dry_run", report
    assert report["live_paths"] == [] and report["restart_required_paths"] == []
    assert (quickstart.work / "var" / "edge.yaml").stat().st_size > 0


def test_adding_a_node_writes_its_config_and_token_and_stages_it(quickstart: Quickstart) -> None:
    """The README's ``iop_node add`` (the journey ``add-node`` adds providers and an alias to
    it): the Node's ``node.yaml`` names the Edge's address as given, its token file is
    private, and the change is staged for the next start."""
    output = quickstart.run(BLOCKS["add-node"])
    assert "Staged revision" in output, output
    node_yaml = yaml.safe_load((quickstart.work / "gpu-box" / "node.yaml").read_text())
    assert node_yaml["node_id"] == "gpu-box"
    assert node_yaml["edge_url"] == quickstart.substitute("wss://EDGE_HOST:7700/ws/node")
    token = quickstart.work / "gpu-box" / "node.token"
    assert oct(token.stat().st_mode & 0o777) == "0o600" and token.read_text().strip()
