"""Revision propagation between Edges (R-SCALE-3, docs/scale-out.md): every
``IOP_REVISION_POLL_S`` an Edge reads the active revision id from the shared database and,
when another Edge activated a new one, loads it and installs it here (pushed to this Edge's
own Nodes only: each Node is connected to one Edge).

The database is read on a worker thread (never on the event loop); the document is loaded and
checked there too. A revision this Edge cannot take live (a restart-required path, only
possible when another Edge activated a staged revision at its start) is not installed: this
Edge keeps what it runs and says, once, that it needs a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from channels.db import database_sync_to_async

from catalog.config import ConfigError, EdgeSnapshot, load_snapshot
from iop_site.companion import TaskCompanion
from refresh.models import ConfigRevision
from refresh.report import diff_report

if TYPE_CHECKING:
    from iop_site.runtime import EdgeRuntime

log = logging.getLogger("iop.refresh")


@dataclass(frozen=True, slots=True)
class Found:
    """The active revision when it is not the one this Edge runs."""

    revision: int
    snapshot: EdgeSnapshot | None  # None: it cannot be installed live (``problem`` says why)
    problem: str = ""


def find_newer(seen: int | None, running: dict[str, Any]) -> Found | None:
    """Synchronous (a worker thread): the active revision if it is not ``seen``, loaded and
    classified against the ``running`` document."""
    active = ConfigRevision.objects.filter(is_active=True).values_list("pk", flat=True).first()
    if active is None or active == seen:
        return None
    document = ConfigRevision.objects.values_list("document", flat=True).get(pk=active)
    try:
        snapshot = load_snapshot(document)
    except ConfigError as exc:
        return Found(active, None, f"its document does not load ({len(exc.issues)} issue(s))")
    report = diff_report(running, snapshot.document, mode="apply", outcome="applied")
    if report.restart_required_paths:
        paths = ", ".join(report.restart_required_paths)
        return Found(active, None, f"it changes restart-required paths ({paths})")
    return Found(active, snapshot)


class RevisionWatcher(TaskCompanion):
    """Polls the active revision id and installs a newer one on the runtime (a companion of
    the runtime in scale-out mode: iop_site.scale)."""

    task_name = "revision-watcher"

    def __init__(
        self,
        runtime: EdgeRuntime,
        *,
        poll_s: float,
        find: Callable[[int | None, dict[str, Any]], Awaitable[Found | None]] | None = None,
    ) -> None:
        super().__init__()
        self.runtime = runtime
        self.poll_s = poll_s
        self._find = find or database_sync_to_async(find_newer)
        self._refused: int | None = None  # the revision already reported as not installable
        self.followed = 0  # revisions installed from another Edge (for tests and the log)

    async def _run(self) -> None:
        while True:
            try:
                await self.check()
            except Exception as exc:  # a database hiccup: look again next round
                log.warning("cannot read the active revision: %s", type(exc).__name__)
            await asyncio.sleep(self.poll_s)

    async def check(self) -> bool:
        """One round; True when a revision from another Edge was installed."""
        runtime = self.runtime
        seen = runtime.revision
        started = time.monotonic()
        found = await self._find(seen, runtime.snapshot.document)
        if found is None or found.revision == self._refused:
            return False
        if found.snapshot is None:
            self._refused = found.revision
            log.error(
                "the active revision is %s but this Edge keeps running revision %s: %s; "
                "restart this Edge to run it (docs/scale-out.md)",
                found.revision,
                seen,
                found.problem,
            )
            return False
        outcome = await runtime.follow(found.snapshot, revision=found.revision, seen=seen)
        if outcome is None:  # a local apply ran meanwhile: the next round looks again
            return False
        self.followed += 1
        log.info(
            "revision %s (activated on another Edge) installed in %.0f ms, pushed to %s",
            found.revision,
            (time.monotonic() - started) * 1000,
            ", ".join(outcome.pushed_nodes) or "no node",
        )
        return True
