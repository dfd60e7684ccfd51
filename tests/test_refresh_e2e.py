"""End to end: POST /refresh on a real Edge with a real Node and a fake upstream.

A pushed refresh swaps the Node's adapter registry while a run drains on the old one
(R-NODE-4, R-NODE-5); applies under load keep every request and lease (R-REF-3).
"""

from __future__ import annotations

import copy
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import yaml

from tests.support import Stack
from tests.support.config import provider
from tests.support.upstream_loop import Hold

pytestmark = pytest.mark.slow
TIMEOUT_S = 10.0


class Edge:
    """The stack plus the document it runs, kept in step with every successful apply."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.document: dict[str, Any] = yaml.safe_load(stack.config_path.read_text())

    def refresh(self, mode: str, document: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        status, answer = self.stack.refresh(mode, document)
        if mode == "apply" and status == 200:
            self.document = document
        return status, answer

    def edit(self) -> dict[str, Any]:
        return copy.deepcopy(self.document)

    def chat(self, *, stream: bool) -> tuple[int, str]:
        body = {
            "model": "gpt-test",
            "stream": stream,
            "messages": [{"role": "user", "content": "hello"}],
        }
        request = urllib.request.Request(
            self.stack.v1_url + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {self.stack.token}",
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def wait_log(self, needle: str, count: int = 1) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while self.stack.logs().count(needle) < count:
            assert time.monotonic() < deadline, f"{needle!r} not logged:\n{self.stack.logs()}"
            time.sleep(0.05)

    def wait_pool(self, what: str, done: Any) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            snapshot = self.stack.pool_snapshot()
            for row in snapshot["providers"]:
                assert min(row["in_flight"], row["long_in_flight"], row["queued"]) >= 0
            if done(snapshot):
                return snapshot
            assert time.monotonic() < deadline, f"{what}: {snapshot}"
            time.sleep(0.02)


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    providers = [
        {"id": "p-a", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 1},
        {"id": "p-b", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 1},
    ]
    models = [{"id": "gpt-test", "providers": {"p-a": "served-a", "p-b": "served-b"}}]
    with Stack(tmp_path_factory.mktemp("refresh-e2e"), providers=providers, models=models) as stack:
        yield Edge(stack)


@pytest.fixture
def hold(edge):
    edge.stack.upstream("main").reset()
    hold = Hold(edge.stack.upstream("main"))
    yield hold
    hold.release()
    edge.stack.upstream("main").reset()
    edge.stack.wait_idle()


def test_a_pushed_refresh_swaps_the_node_registry_while_a_run_drains(edge, hold):
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(edge.chat, stream=True)
        hold.wait_streaming()
        [old_model] = hold.upstream_models()

        candidate = edge.edit()
        candidate["models"][0]["providers"] = {"p-a": "served-a2", "p-b": "served-b2"}
        status, report = edge.refresh("apply", candidate)
        assert status == 200, report
        assert report["pushed_nodes"] == ["node-1"]
        assert report["live_paths"] == [
            'models["gpt-test"].providers["p-a"]',
            'models["gpt-test"].providers["p-b"]',
        ]
        edge.wait_log("config refresh: now on revision")

        # A new run goes through the new registry while the old one still serves the first.
        status, text = edge.chat(stream=False)
        assert status == 200, text
        assert hold.upstream_models()[-1] in ("served-a2", "served-b2")
        assert not running.done()

        hold.release()
        status, text = running.result(TIMEOUT_S)
    assert status == 200 and text.rstrip().endswith("data: [DONE]")
    assert old_model in ("served-a", "served-b")
    assert "refused refresh" not in edge.stack.logs()


def test_applies_under_load_lose_no_request_and_keep_every_lease(edge, hold):
    requests = 6
    with ThreadPoolExecutor(requests) as pool:
        futures: list[Future[tuple[int, str]]] = [
            pool.submit(edge.chat, stream=True) for _ in range(requests)
        ]
        edge.wait_pool("2 running, 4 queued", lambda s: s["queue_depth"] == requests - 2)

        candidate = edge.edit()
        provider(candidate, "p-a")["capacity"] = 3
        assert edge.refresh("apply", candidate)[0] == 200
        edge.wait_pool(
            "capacity raised: 4 running", lambda s: sum(r["in_flight"] for r in s["providers"]) == 4
        )

        candidate = edge.edit()
        provider(candidate, "p-a")["capacity"] = 1
        assert edge.refresh("apply", candidate)[0] == 200
        rows = {r["provider_id"]: r for r in edge.stack.pool_snapshot()["providers"]}
        assert rows["p-a"]["in_flight"] == 3 and rows["p-a"]["capacity"] == 1  # leases kept

        candidate = edge.edit()
        provider(candidate, "p-b")["enabled"] = False
        assert edge.refresh("apply", candidate)[0] == 200
        candidate = edge.edit()
        candidate["models"][0]["providers"]["p-a"] = "served-a3"
        status, report = edge.refresh("apply", candidate)
        assert status == 200 and report["pushed_nodes"] == ["node-1"]
        candidate = edge.edit()
        candidate["provider_pool"]["max_queue"] = 8
        assert edge.refresh("apply", candidate)[0] == 200

        snapshot = edge.stack.pool_snapshot()
        assert snapshot["queue_depth"] == 2 and not any(f.done() for f in futures)
        hold.release()
        results = [f.result(30) for f in futures]
    assert [status for status, _ in results] == [200] * requests
    assert all(text.rstrip().endswith("data: [DONE]") for _, text in results)
    # Everything queued after the disable ran on p-a, under its new mapping.
    assert hold.upstream_models().count("served-a3") >= 2
    candidate = edge.edit()
    provider(candidate, "p-b")["enabled"] = True
    assert edge.refresh("apply", candidate)[0] == 200


def test_a_refused_apply_changes_nothing_on_the_running_edge(edge):
    before = edge.stack.pool_snapshot()
    candidate = edge.edit()
    provider(candidate, "p-a")["capacity"] = 5
    candidate["edge"]["id"] = "edge-renamed"
    status, report = edge.refresh("apply", candidate)
    assert status == 409 and report["restart_required_paths"] == ["edge.id"]
    after = edge.stack.pool_snapshot()
    assert [r["capacity"] for r in after["providers"]] == [
        r["capacity"] for r in before["providers"]
    ]
    status, report = edge.refresh("dry_run", candidate)
    assert status == 200 and report["applied"] is False
