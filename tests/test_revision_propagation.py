"""Revisions between Edges sharing one database (R-SCALE-3, docs/scale-out.md): an Edge
installs the revision another Edge activated, pushes it to its own Nodes, and never one it
cannot take live. Two runtimes in one process stand for two Edges on one database."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from iop_site.revisions import RevisionWatcher
from iop_site.runtime import EdgeRuntime
from refresh import services
from refresh.startup import startup_revision
from tests.support.config import Doc, provider
from tests.support.processes import EDGE_YAML

pytestmark = pytest.mark.django_db(transaction=True)


async def start_edge(config: str | None = str(EDGE_YAML)) -> EdgeRuntime:
    """An Edge started the way runedge starts it, knowing its revision."""
    snapshot, revision = await sync_to_async(startup_revision)(config)
    return EdgeRuntime(snapshot, revision=revision)


@pytest.fixture
async def edges(transactional_db):
    pair = (await start_edge(), await start_edge())
    yield pair
    for runtime in pair:
        await runtime.aclose()


async def capacity(runtime: EdgeRuntime, provider_id: str = "vllm-local") -> int:
    status = await runtime.pool_status()
    row = next(p for p in status["providers"] if p["provider_id"] == provider_id)
    return int(row["capacity"])


async def apply_on(runtime: EdgeRuntime, capacity: int) -> services.Outcome:
    document: Doc = runtime.snapshot.document
    provider(document, "vllm-local")["capacity"] = capacity
    return await sync_to_async(services.apply_document)(
        runtime, document, source="document", author_label="test"
    )


async def test_both_edges_start_on_the_one_active_revision(edges):
    first, second = edges
    assert first.revision is not None and first.revision == second.revision
    assert (await first.pool_status())["revision"] == first.revision


async def test_an_apply_on_one_edge_is_installed_by_the_other_at_its_next_look_r_scale_3(edges):
    first, second = edges
    watcher = RevisionWatcher(second, poll_s=1.0)
    assert await watcher.check() is False  # nothing new yet
    outcome = await apply_on(first, 9)
    assert outcome.status == 200 and first.revision == outcome.revision.pk
    assert await capacity(second) != 9
    assert await watcher.check() is True
    assert second.revision == first.revision and await capacity(second) == 9
    assert second.snapshot.digest == first.snapshot.digest
    assert await watcher.check() is False  # installed once


async def test_the_watcher_keeps_this_edges_listeners(edges):
    """Listen addresses are per Edge (IOP_*_LISTEN): a followed revision never moves them."""
    from dataclasses import replace

    from catalog.config.addresses import HostPort

    first, second = edges
    second._snapshot = replace(second.snapshot, openai_listen=HostPort("127.0.0.1", 18081))
    await apply_on(first, 7)
    assert await RevisionWatcher(second, poll_s=1.0).check() is True
    assert second.snapshot.openai_listen == HostPort("127.0.0.1", 18081)


async def test_a_local_apply_during_the_look_wins_over_what_was_read(edges):
    """The watcher read revision N; meanwhile this Edge applied N+1 itself: N is not installed
    over it (the next look finds N+1 active and the Edge already on it)."""
    first, second = edges
    seen = second.revision
    await apply_on(first, 5)
    await apply_on(second, 6)  # second applies on top of first's revision
    followed = await second.follow(first.snapshot, revision=first.revision, seen=seen)
    assert followed is None and await capacity(second) == 6
    assert await RevisionWatcher(second, poll_s=1.0).check() is False


async def test_a_revision_that_needs_a_restart_is_not_installed_and_is_reported_once(edges, caplog):
    """Only a staged revision activated at another Edge's start can get there; this Edge
    keeps running what it runs and says it needs a restart."""
    first, second = edges
    document = first.snapshot.document
    document["edge"]["listen"] = "127.0.0.1:7719"
    created = await sync_to_async(services.stage_document)(
        document, source="document", author_label="test"
    )
    assert created.status == 200
    restarted = await start_edge(None)  # another Edge restarts: the staged one is active
    try:
        before = second.revision
        watcher = RevisionWatcher(second, poll_s=1.0)
        with caplog.at_level(logging.ERROR, logger="iop.refresh"):
            assert await watcher.check() is False
            assert await watcher.check() is False
        assert second.revision == before and restarted.revision != before
        lines = [r.getMessage() for r in caplog.records if "restart this Edge" in r.getMessage()]
        assert len(lines) == 1 and "edge.listen" in lines[0]
    finally:
        await restarted.aclose()


async def test_the_watcher_runs_in_the_background_until_closed(edges, monkeypatch):
    first, second = edges
    installed = asyncio.Event()
    real_follow = second.follow

    async def follow(*args: Any, **kwargs: Any) -> Any:
        outcome = await real_follow(*args, **kwargs)
        installed.set()
        return outcome

    monkeypatch.setattr(second, "follow", follow)
    watcher = RevisionWatcher(second, poll_s=0.05)
    await watcher.start()
    try:
        outcome = await apply_on(first, 3)
        async with asyncio.timeout(10):
            await installed.wait()
    finally:
        await watcher.aclose()
    assert second.revision == outcome.revision.pk and watcher.followed == 1
