"""The operator journeys of docs/journeys.md, run as written against real processes.

One Edge set up as `make run` sets it up, its local Node from this checkout's venv, and a
second Node ``gpu-box`` installed on its own from a copy of the checkout with the page's own
install commands (the Node-only distribution: no Django). The tests run in file order and
share that Edge: each journey starts where the previous one ended, as an operator's would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.journeys import (
    JOURNEYS_MD,
    JourneyEdge,
    doc_blocks,
    journey_blocks,
    source_checkout,
    wait_for,
)
from tests.support.wheelhouse import DOWNLOAD_TIMEOUT_S, package_index

pytestmark = pytest.mark.slow

BLOCKS = journey_blocks()
REFRESH_BLOCKS = doc_blocks(JOURNEYS_MD.parent / "refresh.md", "refresh")
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
INSTALL_TIMEOUT_S = 600
# The tests that may be the first to use ``node_machine``: its install runs pip, after the
# session's one download from the package index (tests/support/wheelhouse.py; seconds on a
# good day, minutes on a slow one), so their hang guard is those bounds plus the test's, in
# place of pytest-timeout's default 120 s.
installs_node = pytest.mark.timeout(DOWNLOAD_TIMEOUT_S + INSTALL_TIMEOUT_S + 120)
ECHO_CAPACITY = 'nodes["node-local"].providers["echo-cli"].capacity'


def admin_labels() -> list[str]:
    """The labels the admin journey tells the operator to click, in order (``*Label*``)."""
    text = JOURNEYS_MD.read_text()
    section = text.split("## Change a capacity from the admin", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"\*([^*]+)\*", section)


def gate_provider(gate: Path) -> dict[str, Any]:
    """A CLI provider that answers only once ``gate`` exists (bounded): a request in flight."""
    script = (
        "import os, sys, time\n"
        "deadline = time.monotonic() + 60\n"
        f"while not os.path.exists({str(gate)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.02)\n"
        "print('slow:', sys.stdin.read())\n"
    )
    return {"id": "slow-cli", "type": "cli", "command": ["python3", "-c", script], "capacity": 1}


def node_env() -> dict[str, str]:
    """The Node machine's environment: nothing of this checkout's venv or Django settings."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE", "DATABASE_URL")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PYTEST_")}
    return {**env, "PYTHONUNBUFFERED": "1"}


@dataclass
class NodeMachine:
    checkout: Path
    install_output: str
    install_seconds: float


@pytest.fixture(scope="module")
def node_machine(tmp_path_factory: pytest.TempPathFactory) -> NodeMachine:
    """The ``node-install`` block run once in a copy of the checkout (a fresh clone)."""
    checkout = source_checkout(tmp_path_factory.mktemp("node-machine"))
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", BLOCKS["node-install"]],
        cwd=checkout,
        env={**node_env(), **package_index()},  # a local mirror (tests/support/wheelhouse.py)
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return NodeMachine(checkout, done.stdout + done.stderr, time.monotonic() - started)


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JourneyEdge]:
    directory = tmp_path_factory.mktemp("journeys")
    journey = JourneyEdge(
        directory,
        extra_providers=[gate_provider(directory / "gate")],
        extra_models=[{"id": "slow", "providers": {"slow-cli": "slow"}}],
    )
    try:
        journey.tokens = journey.first_run()
        journey.start()
        journey.start_local_node()
        journey.wait_provider("echo-cli", lambda row: bool(row and row["online"]), "node-local")
        yield journey
    finally:
        journey.stop()


def chat(edge: JourneyEdge, model: str) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{edge.ports['openai']}/v1/chat/completions",
        data=json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={
            "Authorization": f"Bearer {edge.tokens['client']}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        return resp.status, json.loads(resp.read())


def restart(edge: JourneyEdge) -> None:
    assert edge.stop_edge() == 0, edge.logs()
    edge.start()


def node_start(edge: JourneyEdge, node: NodeMachine) -> None:
    """The ``node-start`` block on the Node's machine: every line but the last runs to its
    end; the last one is the Node itself, left running."""
    *checks, service = BLOCKS["node-start"].strip().splitlines()
    output = edge.run("\n".join(checks), cwd=node.checkout)
    assert "gpu-box/node.yaml: ok" in output
    edge.service("gpu-box", service, node.checkout, node_env())


@installs_node
def test_the_node_only_install_runs_iop_node_without_django(node_machine: NodeMachine) -> None:
    """The documented Node install has ``iop-node`` and neither Django nor the Edge's server."""
    assert "usage: iop-node" in node_machine.install_output
    python = node_machine.checkout / ".venv" / "bin" / "python"
    for module in ("django", "daphne", "rest_framework", "channels"):
        found = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
        assert found.returncode != 0 and "No module named" in found.stderr, module
    code = "import nodes.agent.main, nodes.agent.cli"
    agent = subprocess.run([python, "-c", code], capture_output=True)
    assert agent.returncode == 0, agent.stderr


def test_the_local_node_runs_the_example_cli_under_make_runs_policy_r_tls_6(
    edge: JourneyEdge,
) -> None:
    """R-TLS-6..8 with `make run`'s defaults: the policy it writes lists each program as its
    exact argv ("$" last, read as exact by Nodes of both versions), no environment name and
    single secret files; the local Node starts without a policy warning and its cli provider
    answers (in its own run directory) as the README says."""
    policy = yaml.safe_load((edge.work / "var" / "node.yaml").read_text())["policy"]
    assert policy["env"] == [] and policy["secrets"] == {"env": [], "files": []}
    assert policy["commands"] and all(entry[-1] == "$" for entry in policy["commands"])
    status, body = chat(edge, "echo")
    assert status == 200 and body["choices"][0]["message"]["content"] == "hi\n"
    node_log = (edge.dir / "node-local.log").read_text()
    assert "policy.commands" not in node_log and "refused by node policy" not in node_log


@installs_node
def test_adding_a_node_stages_it_and_a_draining_restart_activates_it(
    edge: JourneyEdge, node_machine: NodeMachine
) -> None:
    """``iop_node add`` writes node.yaml and a private token and stages the node (restart-
    required, R-REF-2); the restart finishes a running request first; the Node serves."""
    output = edge.run(BLOCKS["add-node"])
    assert "Staged revision" in output
    token_file = edge.work / "gpu-box" / "node.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert edge.provider("gpu-echo") is None  # staged, not running

    answer: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: answer.update(zip(("status", "body"), chat(edge, "slow"), strict=True))
    )
    thread.start()
    edge.wait_provider("slow-cli", lambda row: bool(row and row["in_flight"] == 1), "in flight")
    assert edge.edge is not None and edge.edge.popen is not None
    edge.edge.popen.terminate()  # the restart's SIGTERM, while the request runs
    wait_for(lambda: "stopping: waiting" in edge.edge_log(), 30, "the drain", log=edge.logs)
    (edge.dir / "gate").touch()
    thread.join(60)
    assert answer["status"] == 200
    assert answer["body"]["choices"][0]["message"]["content"].startswith("slow:")
    restart(edge)

    shutil.copytree(edge.work / "gpu-box", node_machine.checkout / "gpu-box")
    node_start(edge, node_machine)
    edge.wait_provider("gpu-echo", lambda row: bool(row and row["online"]), "gpu-box online")
    pool = edge.json_lines(edge.run(BLOCKS["pool"]))[0]
    assert any(p["provider_id"] == "gpu-echo" and p["online"] for p in pool["providers"])
    status, body = chat(edge, "echo")  # gpu-echo has the better priority
    assert status == 200 and body["choices"][0]["message"]["content"].startswith("gpu-box:")


@installs_node
def test_rotating_a_node_token_refuses_the_old_one_until_the_node_has_the_new_one(
    edge: JourneyEdge, node_machine: NodeMachine
) -> None:
    """After ``iop_node rotate`` and a restart the old token is refused, and both sides say so;
    the Node picks up the copied token file on its next attempt (R-CFG-12)."""
    old = (node_machine.checkout / "gpu-box" / "node.token").read_text()
    assert "Staged revision" in edge.run(BLOCKS["rotate-token"])
    new = (edge.work / "gpu-box" / "node.token").read_text()
    assert new != old
    restart(edge)
    node_log = edge.dir / "gpu-box.log"
    wait_for(
        lambda: (
            "node gpu-box refused: its token does not match" in edge.edge_log()
            and "the Edge refused node gpu-box (HTTP 403)" in node_log.read_text()
        ),
        45,
        "the refusal logged on both sides",
        log=edge.logs,
    )
    assert new.strip() not in edge.logs() and old.strip() not in edge.logs()
    shutil.copy(edge.work / "gpu-box" / "node.token", node_machine.checkout / "gpu-box")
    edge.wait_provider("gpu-echo", lambda row: bool(row and row["online"]), "gpu-box back")


def test_exporting_what_runs_writes_the_active_revision_to_a_file(edge: JourneyEdge) -> None:
    """The page's first command: what runs, as a file to edit (here before any live change:
    the local CLI provider still has the example's capacity)."""
    assert edge.run(BLOCKS["export"]) == ""
    exported = yaml.safe_load((edge.work / "var" / "edge.yaml").read_text())
    nodes = {node["id"]: node for node in exported["nodes"]}
    assert {"node-local", "gpu-box"} <= set(nodes)
    (echo,) = [p for p in nodes["node-local"]["providers"] if p["id"] == "echo-cli"]
    assert echo["capacity"] == edge.provider("echo-cli")["capacity"] == 2  # type: ignore[index]


@pytest.mark.parametrize("form", ["yaml", "json"])
def test_refresh_pages_two_request_forms_dry_run_what_runs(edge: JourneyEdge, form: str) -> None:
    """docs/refresh.md's two ways to send a document (YAML with the mode in the query, a
    JSON envelope), as written: what runs, sent back, changes nothing."""
    (report,) = edge.json_lines(edge.run(REFRESH_BLOCKS[form]))
    assert report["outcome"] == "dry_run", report
    assert report["live_paths"] == [] and report["restart_required_paths"] == []


def test_changing_a_capacity_from_the_shell_applies_it_live(edge: JourneyEdge) -> None:
    """Export what runs, edit, dry-run, apply: a live path, no restart (R-REF-1, R-REF-3)."""
    dry, applied = edge.json_lines(edge.run(BLOCKS["capacity-shell"]))
    assert dry["outcome"] == "dry_run" and ECHO_CAPACITY in dry["live_paths"]
    assert dry["restart_required_paths"] == [] and dry["active"] is not None
    assert applied["outcome"] == "applied", applied
    edge.wait_provider("echo-cli", lambda row: bool(row and row["capacity"] == 3), "capacity 3")


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium")
def test_changing_a_capacity_from_the_admin_follows_the_documented_clicks(
    edge: JourneyEdge,
) -> None:
    """The page's admin steps, clicked by their labels in a real browser: the catalog edit,
    a revision from it, its dry-run and a live apply (R-REF-1, R-REF-3)."""
    from playwright.sync_api import sync_playwright

    labels = admin_labels()
    assert labels == [
        "Providers", "echo-cli", "Capacity", "Save",
        "Config revisions", "Create revision from catalog", "Apply live",
    ]  # fmt: skip
    providers, provider, capacity, save, revisions, create, apply = labels
    base = f"http://127.0.0.1:{edge.ports['openai']}"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(15_000)
            page.goto(base + "/admin/")
            page.fill("#id_username", "admin")
            page.fill("#id_password", edge.tokens["admin"])
            page.click("input[type=submit]")
            page.get_by_role("link", name=providers, exact=True).first.click()
            page.get_by_role("link", name=provider, exact=True).click()
            assert "/change/" in page.url, page.url + page.inner_text("body")[:3000]
            page.get_by_label(re.compile(rf"^{capacity}:?$")).fill("4")  # Django adds ":"
            page.get_by_role("button", name=save, exact=True).click()
            page.goto(base + "/admin/")
            page.get_by_role("link", name=revisions, exact=True).first.click()
            page.get_by_role("button", name=create).click()
            row = page.locator("tr", has_text=ECHO_CAPACITY)
            assert row.locator("td.refresh-values").inner_text().strip() == "3 → 4"  # the page
            page.get_by_role("button", name=apply).click()
            assert "Applied revision" in page.locator(".messagelist").inner_text()
        finally:
            browser.close()
    edge.wait_provider("echo-cli", lambda row: bool(row and row["capacity"] == 4), "capacity 4")


def test_rolling_back_applies_the_previous_revision(edge: JourneyEdge) -> None:
    """``export --revision previous`` and an apply undo the last change (R-REF-3)."""
    before = edge.provider("echo-cli")
    assert before is not None
    # The last change was the admin journey's 3 -> 4, or the shell journey's 2 -> 3 when the
    # browser journey was skipped (no Chromium): the rollback restores the value before it.
    restored = {4: 3, 3: 2}[before["capacity"]]
    dry, applied = edge.json_lines(edge.run(BLOCKS["rollback"]))
    assert ECHO_CAPACITY in dry["live_paths"]
    assert applied["outcome"] == "applied", applied
    edge.wait_provider(
        "echo-cli",
        lambda row: bool(row and row["capacity"] == restored),
        f"the capacity before ({restored})",
    )


def test_a_restart_required_change_sent_with_mode_stage_is_staged(edge: JourneyEdge) -> None:
    """The page's stage command: a restart-required change (here the header deadline) is
    staged for the next start, never applied live."""
    edge.run(BLOCKS["export"])
    exported = edge.work / "var" / "edge.yaml"
    document = yaml.safe_load(exported.read_text())
    document["openai"]["header_timeout_s"] = 20
    exported.write_text(yaml.safe_dump(document, sort_keys=False))
    (staged,) = edge.json_lines(edge.run(BLOCKS["stage"]))
    assert staged["outcome"] == "staged", staged
    assert "openai.header_timeout_s" in staged["restart_required_paths"]


def test_removing_a_node_takes_it_out_at_the_restart(edge: JourneyEdge) -> None:
    """``iop_node remove`` stages the removal; after the restart the Edge refuses the Node as
    not in the running revision and its provider is gone from the pool."""
    assert "Staged revision" in edge.run(BLOCKS["remove-node"])
    restart(edge)
    wait_for(
        lambda: "node 'gpu-box' refused: it is not in the running revision" in edge.edge_log(),
        45,
        "the removed node refused",
        log=edge.logs,
    )
    assert edge.provider("gpu-echo") is None
    edge.wait_provider("echo-cli", lambda row: bool(row and row["online"]), "node-local back")
    status, body = chat(edge, "echo")
    assert status == 200 and not body["choices"][0]["message"]["content"].startswith("gpu-box")
