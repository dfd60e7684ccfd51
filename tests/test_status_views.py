"""Pool status for staff: GET /api/pool/, the admin page and its live JSON feed (R-POOL-8)."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from django.contrib.auth.models import User
from django.test import Client

from catalog.config import load_snapshot
from edgekit.running import attach_runtime
from iop_site.runtime import EdgeRuntime
from pool.engine import Lease
from tests.support.clock import Clock

T = TypeVar("T")


def _provider(pid: str, capacity: int, priority: int, enabled: bool = True) -> dict[str, Any]:
    return {
        "id": pid,
        "profile": "openai",
        "base_url": "http://127.0.0.1:9/v1",
        "capacity": capacity,
        "priority": priority,
        "enabled": enabled,
    }


DOC = {
    "edge": {"id": "edge-status", "listen": "127.0.0.1:7700"},
    "admin": {"listen": "127.0.0.1:7701"},
    "openai": {"enabled": True, "listen": "127.0.0.1:8080"},
    "nodes": [
        {
            "id": "node-a",
            "token_hash_sha256": "ab" * 32,
            "providers": [
                _provider("p-busy", 2, 10),
                _provider("p-full", 1, 20),
                _provider("p-idle", 1, 30),
                _provider("p-off", 1, 40, enabled=False),
                _provider("p-refused", 1, 50),
            ],
        },
        {
            "id": "node-b",
            "token_hash_sha256": "cd" * 32,
            "providers": [_provider("p-remote", 3, 10)],
        },
    ],
    "models": [
        {"id": "m-busy", "providers": {"p-busy": "busy-model"}},
        {"id": "m-full", "providers": {"p-full": "full-model"}},
        {"id": "m-idle", "providers": {"p-idle": "idle-model"}},
        {"id": "m-rest", "providers": {"p-off": "off-model", "p-remote": "remote-model"}},
    ],
}
# node-a is ready, node-b never connected: p-busy 1/2, p-full 1/1 with one waiter, p-idle 0/1.
EXPECTED_STATES = {
    "p-busy": "busy",
    "p-full": "saturated",
    "p-idle": "idle",
    "p-off": "disabled",
    "p-refused": "unavailable",
    "p-remote": "offline",
}
REFUSAL = "refused by node policy: command /bin/evil is not an allowed command"


class LivePool:
    """A real EdgeRuntime whose pool runs on its own event loop thread, as under daphne."""

    def __init__(self) -> None:
        self.clock = Clock(1000.0)  # a fixed clock makes waits exact
        self.runtime = EdgeRuntime(load_snapshot(DOC), clock=self.clock)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        async def wrapped() -> T:
            return await fn(*args)

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(timeout=5)

    def call(self, fn: Callable[[], T]) -> T:
        async def wrapped() -> T:
            return fn()

        return self.run(wrapped)

    def snapshot(self) -> dict[str, Any]:
        return self.call(lambda: self.runtime.pool.snapshot().as_dict())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()


@pytest.fixture
def live() -> Iterator[tuple[LivePool, list[Lease]]]:
    pool = LivePool()
    engine = pool.runtime.pool
    pool.call(lambda: engine.node_ready("node-a", 1, {"p-refused": REFUSAL}))
    leases = [pool.run(engine.acquire, model) for model in ("m-busy", "m-full")]
    waiting = pool.call(lambda: pool.loop.create_task(engine.acquire("m-full")))
    pool.run(asyncio.sleep, 0)  # one loop turn: the task has queued its waiter
    assert pool.snapshot()["queue_depth"] == 1
    pool.clock.now += 2.5
    attach_runtime(pool.runtime)
    yield pool, leases
    attach_runtime(None)
    pool.call(waiting.cancel)
    pool.run(asyncio.wait, [waiting])
    if not waiting.cancelled():  # a test handed it a slot
        leases.append(waiting.result())
    pool.call(lambda: [engine.release(lease) for lease in leases])
    assert pool.call(engine.idle)
    pool.close()


@pytest.fixture
def staff_client(db: None) -> Client:
    client = Client()
    client.force_login(User.objects.create_user("ops", password="x" * 12, is_staff=True))
    return client


@pytest.fixture
def plain_client(db: None) -> Client:
    client = Client()
    client.force_login(User.objects.create_user("dev", password="x" * 12))
    return client


def _row_states(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-provider="([^"]+)" data-state="([^"]+)"', html))


def test_api_pool_gives_staff_the_pool_snapshot_unchanged(live, staff_client) -> None:
    pool, _ = live
    response = staff_client.get("/api/pool/")
    assert response.status_code == 200
    body = response.json()
    gate = body.pop("gate")  # Stream Evidence Gate counts, beside the engine's snapshot
    body.pop("revision")  # the revision this Edge runs, beside it too
    ttft = body.pop("ttft")  # R-OBS-3: time to first token per provider, recent window
    groups = body.pop("groups")  # R-QUEUE-4: each group's queue and estimate
    assert body == pool.snapshot() and gate == {} and ttft == {}
    none = {"affinity_hits": 0, "affinity_misses": 0}  # R-AFF-1: no keyed request yet
    assert groups["m-full"] == {"queued": 1, "eta_ms": None, **none}  # nothing measured
    assert groups["m-idle"] == {"queued": 0, "eta_ms": 0, **none}
    full = next(row for row in body["providers"] if row["provider_id"] == "p-full")
    assert (full["in_flight"], full["queued"], body["queue_depth"]) == (1, 1, 1)


def test_api_pool_refuses_anonymous_and_non_staff(live, plain_client) -> None:
    assert Client().get("/api/pool/").status_code == 403
    assert plain_client.get("/api/pool/").status_code == 403


@pytest.mark.parametrize("url", ["/admin/pool-status/", "/admin/pool-status/status.json"])
def test_status_page_and_feed_send_anonymous_and_non_staff_to_the_login(
    live, plain_client, url: str
) -> None:
    for client in (Client(), plain_client):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/?next=")


def test_status_page_renders_every_provider_with_its_state(live, staff_client) -> None:
    response = staff_client.get("/admin/pool-status/")
    assert response.status_code == 200
    html = response.content.decode()
    assert _row_states(html) == EXPECTED_STATES
    assert f'data-field="unavailable">{REFUSAL}<' in html  # R-TLS-3: the reason is shown
    assert re.search(r'id="queue-depth">1<', html)
    assert re.search(r'id="oldest-wait">2.5 s<', html)
    assert 'data-url="/admin/pool-status/status.json"' in html


def test_status_feed_reports_state_per_provider_and_the_queue(live, staff_client) -> None:
    pool, _ = live
    response = staff_client.get("/admin/pool-status/status.json")
    assert response.status_code == 200
    assert "no-cache" in response["Cache-Control"]
    body = response.json()
    assert {row["provider_id"]: row["state"] for row in body["providers"]} == EXPECTED_STATES
    assert body["queue_depth"] == 1
    assert (body["oldest_wait_ms"], body["oldest_wait"]) == (2500.0, "2.5 s")
    groups = {g["id"]: (g["queued"], g["eta"]) for g in body["groups"]}
    assert (groups["m-full"], groups["m-idle"]) == ((1, "unknown"), (0, "none"))
    assert body["counts"] == {
        "ejected": 0,
        "probing": 0,
        "saturated": 1,
        "busy": 1,
        "idle": 1,
        "disabled": 1,
        "unavailable": 1,
        "offline": 1,
    }
    refused = next(row for row in body["providers"] if row["provider_id"] == "p-refused")
    assert (refused["online"], refused["unavailable"]) == (False, REFUSAL)
    engine_rows = {row["provider_id"]: row for row in pool.snapshot()["providers"]}
    for row in body["providers"]:
        engine_row = engine_rows[row["provider_id"]]
        assert {key: row[key] for key in engine_row} == engine_row


def test_status_feed_follows_the_pool_between_polls(live, staff_client) -> None:
    pool, leases = live
    pool.call(lambda: pool.runtime.pool.release(leases[0]))  # p-busy back to idle
    pool.call(lambda: pool.runtime.pool.release(leases[1]))  # the waiter takes p-full's slot
    body = staff_client.get("/admin/pool-status/status.json").json()
    states = {row["provider_id"]: row["state"] for row in body["providers"]}
    assert states["p-busy"] == "idle"
    assert states["p-full"] == "saturated"
    assert body["queue_depth"] == 0


@pytest.mark.django_db(transaction=True)
async def test_views_take_the_snapshot_on_the_event_loop_that_owns_the_pool(async_client) -> None:
    """Under ASGI the sync views run in a worker thread; the pool is only read on its loop."""
    from asgiref.sync import sync_to_async

    runtime = EdgeRuntime(load_snapshot(DOC))
    real_snapshot = runtime.pool.fresh_snapshot
    loops: list[asyncio.AbstractEventLoop] = []

    async def recording_snapshot() -> Any:
        loops.append(asyncio.get_running_loop())
        return await real_snapshot()

    runtime.pool.fresh_snapshot = recording_snapshot  # type: ignore[method-assign]
    user = await sync_to_async(User.objects.create_user)("ops", password="x" * 12, is_staff=True)
    await async_client.aforce_login(user)
    attach_runtime(runtime)
    try:
        for url in ("/api/pool/", "/admin/pool-status/", "/admin/pool-status/status.json"):
            assert (await async_client.get(url)).status_code == 200
    finally:
        attach_runtime(None)
    assert loops == [asyncio.get_running_loop()] * 3


def test_the_admin_index_links_the_status_page_and_keeps_the_pool_app_index(
    live, staff_client
) -> None:
    index = staff_client.get("/admin/").content.decode()
    assert 'href="/admin/pool-status/"' in index
    staff = User.objects.get(username="ops")
    staff.is_superuser = True
    staff.save()
    assert staff_client.get("/admin/pool/").status_code == 200  # the usage rows' app index


def test_status_page_shows_the_gate_counts_of_each_provider_r_seg_6(live, staff_client) -> None:
    """R-SEG-6: the page shows fired / recovered / exhausted / observed per provider."""
    pool, _ = live
    pool.call(lambda: [pool.runtime.gate.add("p-busy", o) for o in ("fired", "fired", "recovered")])
    html = staff_client.get("/admin/pool-status/").content.decode()
    cell = re.search(r'data-provider="p-busy".*?data-field="gate">([^<]*)<', html, re.S)
    assert cell is not None and cell.group(1) == "2 / 1 / 0 / 0"


def test_the_legend_explains_every_column_that_is_not_plain(live, staff_client) -> None:
    """Every column header is either plain words (node, provider, the state's legend above
    it, yes/no columns) or explained under the table, the Gate column with its four counts."""
    html = staff_client.get("/admin/pool-status/").content.decode()
    headers = re.findall(r"<th[^>]*>([^<]+)</th>", html.split("</thead>")[0])
    plain = {"Node", "Provider", "State", "In flight / capacity", "Priority", "Enabled", "Online"}
    columns = html.split('id="pool-columns"', 1)[1].split("</p>", 1)[0]
    explained = set(re.findall(r"<strong>([^<]+)</strong>", columns))
    assert set(headers) - plain == explained, (headers, explained)
    gate = columns.split("<strong>Gate</strong>", 1)[1].split("<strong>", 1)[0]
    assert "fired / recovered / exhausted / observed" in gate


def test_status_page_and_feed_show_ttft_p50_p95_per_provider_r_obs_3(live, staff_client) -> None:
    """R-OBS-3: time to first token p50 / p95 per provider over the recent window."""
    pool, _ = live
    window = pool.runtime.meter.latency.window
    pool.call(lambda: [window.add("p-busy", s) for s in (0.1, 0.2, 0.3, 0.4, 2.0)])
    html = staff_client.get("/admin/pool-status/").content.decode()
    cell = re.search(r'data-provider="p-busy".*?data-field="ttft">([^<]*)<', html, re.S)
    assert cell is not None and cell.group(1) == "300 ms / 2.0 s"
    feed = staff_client.get("/admin/pool-status/status.json").json()
    ttft = {row["provider_id"]: row["ttft"] for row in feed["providers"]}
    assert ttft["p-busy"] == "300 ms / 2.0 s" and ttft["p-idle"] == "-"
