"""Apply on a running Edge: Node pushes (R-NODE-4, R-REF-5), serialized applies, and applies
under load that keep every lease and re-evaluate every waiter (R-REF-3, R-POOL-5, R-POOL-6)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from iop_site.runtime import EdgeRuntime
from nodes import wire
from pool.engine import Lease, Unavailable
from refresh import services
from refresh.models import ConfigRevision
from refresh.startup import startup_snapshot
from tests.support.config import Doc, provider
from tests.support.processes import EDGE_YAML

pytestmark = pytest.mark.django_db(transaction=True)


def model(doc: Doc, model_id: str) -> Doc:
    return next(m for m in doc["models"] if m["id"] == model_id)


class Transport:
    """The Node end of a hub session: records every frame the Edge sends."""

    def __init__(self) -> None:
        self.frames: list[Any] = []
        self.session: Any = None

    async def send(self, frame: bytes) -> None:
        self.frames.append(wire.decode_from_edge(frame))

    async def close(self, code: int) -> None:
        pass

    def refreshes(self) -> list[wire.ConfigRefresh]:
        return [f for f in self.frames if isinstance(f, wire.ConfigRefresh)]


@pytest.fixture
async def edge(transactional_db):
    runtime = EdgeRuntime(await sync_to_async(startup_snapshot)(str(EDGE_YAML)))
    yield runtime
    await runtime.aclose()


async def ready_node(runtime: EdgeRuntime, node_id: str = "node-local") -> Transport:
    """Register a Node on the hub and ack its payload: it is dispatch-ready (R-NODE-1)."""
    transport = Transport()
    session = transport.session = await runtime.hub.connect(node_id, transport)
    await runtime.hub.receive(
        session, wire.encode(wire.Register(node_id=node_id, protocol=wire.PROTOCOL_VERSION))
    )
    response = transport.frames[-1]
    assert isinstance(response, wire.RegisterResponse)
    await runtime.hub.receive(
        session,
        wire.encode(wire.Ready(generation=session.generation, revision=response.payload.revision)),
    )
    return transport


async def apply(
    runtime: EdgeRuntime, edit: Callable[[Doc], object], parent: int | None = None
) -> services.Outcome:
    document = runtime.snapshot.document
    edit(document)
    return await sync_to_async(services.apply_document)(
        runtime, document, source="document", author_label="test", parent=parent
    )


# --- pushes --------------------------------------------------------------------------------------


async def test_a_payload_change_is_pushed_to_each_ready_node(edge):
    transport = await ready_node(edge)
    assert transport.refreshes() == []
    outcome = await apply(
        edge, lambda d: model(d, "echo")["providers"].update({"echo-cli": "echo-v2"})
    )
    assert outcome.status == 200 and outcome.body["pushed_nodes"] == ["node-local"]
    [refresh] = transport.refreshes()
    echo = next(p for p in refresh.payload.providers if p.id == "echo-cli")
    assert echo.served_models == {"echo": "echo-v2"}


async def test_a_no_change_apply_pushes_nothing(edge):
    """R-REF-5: the snapshot is swapped, no Node hears about it."""
    transport = await ready_node(edge)
    frames = len(transport.frames)
    before = edge.snapshot
    outcome = await apply(edge, lambda d: None)
    assert outcome.status == 200 and outcome.body["pushed_nodes"] == []
    assert edge.snapshot is not before
    assert len(transport.frames) == frames


async def test_a_live_pool_edit_that_leaves_the_payload_alone_pushes_nothing(edge):
    transport = await ready_node(edge)
    outcome = await apply(edge, lambda d: provider(d, "vllm-local").update(capacity=9))
    assert outcome.body["changed_nodes"] == ["node-local"]
    assert outcome.body["pushed_nodes"] == [] and transport.refreshes() == []


async def test_a_pending_node_is_not_pushed(edge):
    """R-NODE-4: only dispatch-ready Nodes are pushed (that it gets the new payload at ready
    is test_node_hub.py::test_a_node_pending_during_a_refresh_gets_the_new_payload_at_ready)."""
    transport = Transport()
    session = await edge.hub.connect("node-local", transport)
    await edge.hub.receive(
        session, wire.encode(wire.Register(node_id="node-local", protocol=wire.PROTOCOL_VERSION))
    )
    outcome = await apply(
        edge, lambda d: model(d, "echo")["providers"].update({"echo-cli": "echo-v3"})
    )
    assert outcome.body["pushed_nodes"] == [] and transport.refreshes() == []


# --- serialization -------------------------------------------------------------------------------


async def test_two_concurrent_applies_on_the_same_parent_are_serialized(edge):
    """One wins; the other is refused because its parent is no longer active."""
    parent = (await sync_to_async(services.active_revision)()).pk

    def candidate(capacity: int) -> Doc:
        document = edge.snapshot.document
        provider(document, "vllm-local")["capacity"] = capacity
        return document

    def run(document: Doc) -> services.Outcome:
        try:
            return services.apply_document(
                edge, document, source="document", author_label="t", parent=parent
            )
        finally:
            connections.close_all()

    outcomes = await asyncio.gather(
        sync_to_async(run, thread_sensitive=False)(candidate(5)),
        sync_to_async(run, thread_sensitive=False)(candidate(6)),
    )
    statuses = sorted(o.status for o in outcomes)
    assert statuses == [200, 409]
    winner = next(o for o in outcomes if o.status == 200)
    loser = next(o for o in outcomes if o.status == 409)
    assert loser.body["outcome"] == "refused_stale_parent"
    active = await sync_to_async(services.active_revision)()
    assert active.pk == winner.body["revision"]
    assert await ConfigRevision.objects.filter(is_active=True).acount() == 1
    expected = provider(active.document, "vllm-local")["capacity"]
    assert edge.snapshot.providers["vllm-local"].capacity == expected


async def test_concurrent_applies_without_a_parent_all_apply_one_after_another(edge):
    def run(capacity: int) -> services.Outcome:
        document = edge.snapshot.document
        provider(document, "vllm-local")["capacity"] = capacity
        try:
            return services.apply_document(edge, document, source="document", author_label="t")
        finally:
            connections.close_all()  # a worker thread's connection would outlive the test DB

    outcomes = await asyncio.gather(
        *(sync_to_async(run, thread_sensitive=False)(c) for c in (5, 6, 7))
    )
    assert [o.status for o in outcomes] == [200, 200, 200]
    revisions = [o.revision for o in outcomes]
    # Each one's parent is the revision that was active when it took the lock: a chain.
    ordered = sorted(revisions, key=lambda r: r.pk)
    for earlier, later in itertools.pairwise(ordered):
        assert later.parent_id == earlier.pk
    active = await sync_to_async(services.active_revision)()
    assert active.pk == ordered[-1].pk


# --- under load ----------------------------------------------------------------------------------


class Load:
    """Requests on the real pool: each holds its lease until the test lets it finish."""

    def __init__(self, runtime: EdgeRuntime) -> None:
        self.runtime = runtime
        self.tasks: list[asyncio.Task[str]] = []
        self.leases: dict[int, Lease] = {}
        self.finish: dict[int, asyncio.Event] = {}
        self.changed = asyncio.Condition()

    def start(self, model_id: str) -> int:
        index = len(self.tasks)
        self.finish[index] = asyncio.Event()
        self.tasks.append(asyncio.create_task(self._request(index, model_id)))
        return index

    async def _request(self, index: int, model_id: str) -> str:
        try:
            lease = await self.runtime.pool.acquire(model_id)
        except Unavailable:
            return "unavailable"
        finally:
            async with self.changed:
                self.changed.notify_all()
        self.leases[index] = lease
        async with self.changed:
            self.changed.notify_all()
        await self.finish[index].wait()
        assert self.runtime.pool.release(lease) is True
        return "ok"

    async def until(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(5), self.changed:
            await self.changed.wait_for(predicate)

    def running_on(self, provider_id: str) -> list[int]:
        return [
            i
            for i, lease in self.leases.items()
            if lease.provider_id == provider_id and not lease.released
        ]

    def rows(self) -> dict[str, Any]:
        snapshot = self.runtime.pool.snapshot()
        for row in snapshot.providers:
            assert row.in_flight >= 0 and row.long_in_flight >= 0 and row.queued >= 0
        assert snapshot.queue_depth >= 0
        return {row.provider_id: row for row in snapshot.providers}


async def test_applies_under_load_keep_leases_and_lose_no_request(edge):
    """R-REF-3: capacity raised and lowered, a provider disabled, a mapping changed — while
    requests run and queue. Only the documented rule ends a request early: a waiter whose
    every candidate is disabled fails at once as unavailable (R-POOL-6)."""
    await ready_node(edge)
    load = Load(edge)
    qwen = [load.start("qwen-local") for _ in range(10)]  # vllm 4 + ollama 1 run, 5 queue
    echo = [load.start("echo") for _ in range(3)]  # echo-cli 2 run, 1 queues
    await load.until(lambda: len(load.leases) == 7)
    assert edge.pool.snapshot().queue_depth == 6

    # Capacity raised: queued qwen requests are dispatched by the apply itself.
    assert (await apply(edge, lambda d: provider(d, "vllm-local").update(capacity=8))).status == 200
    await load.until(lambda: len(load.running_on("vllm-local")) == 8)
    assert load.rows()["vllm-local"].in_flight == 8

    # Capacity lowered below what runs: leases are kept, nothing new starts, nothing fails.
    assert (await apply(edge, lambda d: provider(d, "vllm-local").update(capacity=2))).status == 200
    rows = load.rows()
    assert rows["vllm-local"].in_flight == 8 and rows["vllm-local"].capacity == 2
    assert not any(load.tasks[i].done() for i in qwen)

    # A provider disabled: its running lease stays; the echo waiter loses its only candidate.
    outcome = await apply(edge, lambda d: provider(d, "echo-cli").update(enabled=False))
    assert outcome.status == 200
    await load.until(lambda: load.tasks[echo[2]].done())
    assert load.tasks[echo[2]].result() == "unavailable"
    assert len(load.running_on("echo-cli")) == 2

    # The mapping changed: qwen-local loses ollama-local; the queued qwen request still waits
    # for vllm-local (now full at capacity 2) rather than failing.
    outcome = await apply(edge, lambda d: model(d, "qwen-local")["providers"].pop("ollama-local"))
    assert outcome.status == 200 and outcome.body["live_paths"] == [
        'models["qwen-local"].providers["ollama-local"]'
    ]
    waiting = [i for i in qwen if i not in load.leases]
    assert len(waiting) == 1 and not load.tasks[waiting[0]].done()

    # Let everything finish: the waiter runs once vllm-local drops below its new capacity.
    for index in list(load.leases):
        load.finish[index].set()
    await load.until(lambda: waiting[0] in load.leases)
    assert load.leases[waiting[0]].provider_id == "vllm-local"
    load.finish[waiting[0]].set()
    results = await asyncio.wait_for(asyncio.gather(*load.tasks), 5)
    assert results.count("ok") == 12 and results.count("unavailable") == 1
    assert edge.pool.idle()
    assert all(
        r.in_flight == 0 and r.long_in_flight == 0 and r.queued == 0 for r in load.rows().values()
    )


async def test_a_refused_apply_under_load_changes_nothing_in_the_pool(edge):
    await ready_node(edge)
    load = Load(edge)
    for _ in range(6):
        load.start("qwen-local")
    await load.until(lambda: len(load.leases) == 5)
    before = edge.pool.snapshot()

    def restart_edit(d: Doc) -> None:
        provider(d, "vllm-local")["capacity"] = 8
        d["edge"]["listen"] = "127.0.0.1:7719"

    outcome = await apply(edge, restart_edit)
    assert outcome.status == 409
    after = edge.pool.snapshot()
    assert (after.providers, after.queue_depth) == (before.providers, before.queue_depth)
    for event in load.finish.values():
        event.set()
    assert await asyncio.wait_for(asyncio.gather(*load.tasks), 5) == ["ok"] * 6


async def test_r_xlate_1_translate_is_live(edge):
    """R-XLATE-1: ``models[].translate`` applies live: the same Anthropic request to a CLI
    group is refused before the apply and answered by translation right after it."""
    from pool.http.app import OpenAIApp
    from tests.support.inprocess import Call

    transport = await ready_node(edge)
    app = OpenAIApp(edge)
    body = {"model": "echo", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"x-api-key": "test", "anthropic-version": "2023-06-01"}
    refused = await Call(app, "POST", "/v1/messages", body, headers=headers).done()
    assert refused.status == 400 and refused.json()["error"]["type"] == "invalid_request_error"
    outcome = await apply(edge, lambda d: model(d, "echo").update(translate=True))
    assert outcome.status == 200
    assert [(c["path"], c["class"]) for c in outcome.body["changes"]] == [
        ('models["echo"].translate', "live")
    ]
    call = Call(app, "POST", "/v1/messages", body, headers=headers)
    run = None
    for _ in range(1000):  # bounded: the run frame arrives within a few loop turns
        run = next((f for f in transport.frames if isinstance(f, wire.RunRequest)), None)
        if run is not None:
            break
        await asyncio.sleep(0)
    assert run is not None and run.operation == "chat_completions"
    answer = (
        '{"id":"c1","model":"echo","choices":[{"index":0,"message":{"role":"assistant",'
        '"content":"hi back"},"finish_reason":"stop"}],'
        '"usage":{"prompt_tokens":2,"completion_tokens":2}}'
    )
    await edge.hub.receive(
        transport.session, wire.encode(wire.RunEvent(run_id=run.run_id, data=answer))
    )
    await edge.hub.receive(transport.session, wire.encode(wire.RunEnd(run_id=run.run_id, ok=True)))
    await call.done()
    assert call.status == 200
    reply = call.json()
    assert reply["type"] == "message" and reply["content"] == [{"type": "text", "text": "hi back"}]
    assert edge.pool.idle()


async def test_the_health_keys_apply_live_to_the_next_failure_r_health_2(edge):
    """R-HEALTH-2: the provider_pool health keys are live: the next failure uses them."""
    await ready_node(edge)
    outcome = await apply(
        edge,
        lambda d: d["provider_pool"].update(retry_before_first_byte=0, eject_after_failures=1),
    )
    assert outcome.status == 200
    assert outcome.body["live_paths"] == [
        "provider_pool.eject_after_failures",
        "provider_pool.retry_before_first_byte",
    ]
    assert edge.snapshot.retry_before_first_byte == 0
    lease = await edge.pool.acquire("echo")
    edge.pool.failed(lease, "upstream answered HTTP 503")  # one failure is enough now
    edge.pool.release(lease)
    row = next(p for p in edge.pool.snapshot().providers if p.provider_id == lease.provider_id)
    assert (row.health, row.health_reason) == (
        "ejected",
        "upstream answered HTTP 503 (1 failure in a row)",
    )


async def test_a_probe_interval_change_is_pushed_live_to_the_node_r_health_3(edge):
    transport = await ready_node(edge)
    outcome = await apply(edge, lambda d: provider(d, "vllm-local").update(probe_interval_s=5))
    assert outcome.status == 200 and outcome.body["pushed_nodes"] == ["node-local"]
    [refresh] = transport.refreshes()
    vllm = next(p for p in refresh.payload.providers if p.id == "vllm-local")
    assert vllm.probe_interval_s == 5.0
