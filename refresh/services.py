"""Validate -> diff -> classify -> dry-run / apply / stage: the one path every config change takes.

The admin, the REST API and ``POST /refresh`` all call these functions (synchronous; the async
endpoint wraps them in ``sync_to_async``). Dry-run writes nothing. Apply is refused whole when
any path is restart-required (R-REF-2) or when the candidate's parent is no longer active;
otherwise the revision becomes the active one in a committed transaction, then the running Edge
swaps its snapshot (R-REF-3). A swap that fails leaves the Edge on the old snapshot, and the
rows are put back: the old revision active again, the new one marked failed (docs/refresh.md).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync
from django.db import transaction

from edgekit.running import RunningEdge, running_edge
from refresh.candidate import (
    APPLY,
    CREATE,
    DIFF,
    DRY_RUN,
    INVALID,
    OK,
    RESTART_REQUIRED,
    STAGE,
    STALE,
    SWAP_FAILED,
    Candidate,
    Outcome,
    no_runtime,
    stale,
    with_ids,
)
from refresh.models import ConfigRevision, active_for_change
from refresh.report import Report, diff_report, error_report

if TYPE_CHECKING:
    from catalog.config import EdgeSnapshot

log = logging.getLogger("iop.refresh")

__all__ = [
    "APPLY",
    "CREATE",
    "DIFF",
    "DRY_RUN",
    "OK",
    "STAGE",
    "Outcome",
    "active_revision",
    "apply_document",
    "apply_revision",
    "create_from_catalog",
    "create_revision",
    "dry_run",
    "running_edge",
    "stage_document",
    "stage_revision",
    "with_active",
]

# Applies are serialized across every entry point of the process (Django admin, REST API,
# POST /refresh):
# the parent check, the snapshot swap and the active-row change happen under this lock.
_APPLY_LOCK = threading.Lock()


def active_revision() -> ConfigRevision | None:
    return ConfigRevision.objects.filter(is_active=True).first()


def base_document(runtime: RunningEdge | None) -> dict[str, Any] | None:
    """What a candidate is compared with: the running snapshot, else the active revision."""
    if runtime is not None:
        return runtime.snapshot.document
    active = active_revision()
    return dict(active.document) if active is not None else None


def dry_run(
    document: Any, runtime: RunningEdge | None = None, *, revision: ConfigRevision | None = None
) -> Outcome:
    """Validate and classify against what runs; no side effect of any kind."""
    candidate = Candidate(document, DRY_RUN)
    if candidate.snapshot is None:
        assert candidate.refusal is not None
        return Outcome(candidate.refusal, INVALID, revision)
    report = diff_report(
        base_document(runtime), candidate.snapshot.document, mode=DRY_RUN, outcome=DRY_RUN
    )
    active = active_revision()
    report = report.but(active=active.pk if active else None)
    if revision is not None:
        report = report.but(revision=revision.pk, parent=revision.parent_id)
    return Outcome(report, OK, revision)


def create_revision(
    document: Any, *, source: str, author: Any = None, author_label: str = ""
) -> Outcome:
    """Store a valid document as a draft whose parent is the active revision (no apply)."""
    candidate = Candidate(document, CREATE)
    if candidate.snapshot is None:
        assert candidate.refusal is not None
        return Outcome(candidate.refusal, INVALID)
    active = active_revision()
    report = diff_report(
        active.document if active else None,
        candidate.snapshot.document,
        mode=CREATE,
        outcome="draft",
    )
    with transaction.atomic():  # the row and its report together: never a draft without one
        revision = ConfigRevision.objects.create(
            document=candidate.snapshot.document,
            digest=candidate.snapshot.digest,
            parent=active,
            source=source,
            author=author if getattr(author, "pk", None) else None,
            author_label=author_label or _label(author),
        )
        report = report.but(
            revision=revision.pk, parent=revision.parent_id, active=active.pk if active else None
        )
        _save(revision, report)
    return Outcome(report, OK, revision)


def create_from_catalog(author: Any = None) -> Outcome:
    """A draft revision from the catalog tables as they are now."""
    from catalog.documents import catalog_to_document

    return create_revision(
        catalog_to_document(), source=ConfigRevision.Source.CATALOG, author=author
    )


def apply_revision(runtime: RunningEdge | None, revision: ConfigRevision, *, actor: Any) -> Outcome:
    """Apply a stored revision to the running Edge, or refuse it whole (R-REF-2)."""
    if runtime is None:
        return no_runtime(revision)
    with _APPLY_LOCK:
        with transaction.atomic():
            active = active_for_change()
            committed = _commit(runtime, revision, active, _label(actor))
        return _swap(runtime, committed, _label(actor))


def apply_document(
    runtime: RunningEdge | None,
    document: Any,
    *,
    source: str,
    author_label: str,
    parent: int | None = None,
) -> Outcome:
    """Record a candidate document as a revision and apply it (``POST /refresh`` apply mode).

    ``parent``, when given, must be the active revision's id: a candidate built on an older
    revision is refused instead of silently undoing a change applied in between.
    """
    candidate = Candidate(document, APPLY)
    if candidate.snapshot is None:
        assert candidate.refusal is not None
        return Outcome(candidate.refusal, INVALID)
    if runtime is None:
        return no_runtime()
    with _APPLY_LOCK:
        with transaction.atomic():  # the row is recorded with its outcome, never alone
            active = active_for_change()
            active_id = active.pk if active else None
            if parent is not None and parent != active_id:
                return Outcome(stale(APPLY, "the candidate", parent, active_id), STALE)
            revision = ConfigRevision.objects.create(
                document=candidate.snapshot.document,
                digest=candidate.snapshot.digest,
                parent=active,
                source=source,
                author_label=author_label,
            )
            committed = _commit(runtime, revision, active, author_label, candidate.snapshot)
        return _swap(runtime, committed, author_label)


def stage_document(document: Any, *, source: str, author_label: str) -> Outcome:
    """Record a candidate document as a revision and stage it for the next start
    (``POST /refresh?mode=stage``: the shell's way to a restart-required change)."""
    created = create_revision(document, source=source, author_label=author_label)
    if created.revision is None:
        return Outcome(created.report.but(mode=STAGE), created.status)
    return stage_revision(created.revision, actor=author_label)


def with_active(outcome: Outcome) -> Outcome:
    """Every report names the active revision, refusals included (docs/refresh.md)."""
    if outcome.report.active is not None:
        return outcome
    active = active_revision()
    if active is None:
        return outcome
    return Outcome(outcome.report.but(active=active.pk), outcome.status, outcome.revision)


def stage_revision(revision: ConfigRevision, *, actor: Any) -> Outcome:
    """Mark a revision to become active at the next start (for restart-required changes)."""
    with _APPLY_LOCK, transaction.atomic():
        active = active_for_change()
        refusal = _check(revision, active, STAGE)
        if refusal is not None:
            return refusal
        report = diff_report(
            active.document if active else None, revision.document, mode=STAGE, outcome="staged"
        )
        ConfigRevision.objects.filter(state=ConfigRevision.State.STAGED).exclude(
            pk=revision.pk
        ).update(state=ConfigRevision.State.DRAFT)
        revision.state = ConfigRevision.State.STAGED
        report = with_ids(report, revision, active)
        _save(revision, report)
    log.info("revision %s staged for the next start by %s", revision.pk, _label(actor))
    return Outcome(report, OK, revision)


# --- internals ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Committed:
    """An apply whose rows are committed: the revision is active, the swap is still to do."""

    revision: ConfigRevision
    previous: ConfigRevision | None
    snapshot: EdgeSnapshot
    report: Report


def _commit(
    runtime: RunningEdge,
    revision: ConfigRevision,
    active: ConfigRevision | None,
    actor: str,
    snapshot: EdgeSnapshot | None = None,
) -> _Committed | Outcome:
    """Inside the caller's transaction: refuse (recorded) or make ``revision`` the active one
    and the catalog its document. The running Edge is not touched here."""
    refusal = _check(revision, active, APPLY)
    if refusal is not None:
        return refusal
    if snapshot is None:
        candidate = Candidate(revision.document, APPLY)
        if candidate.snapshot is None:
            assert candidate.refusal is not None
            return _refuse(revision, candidate.refusal, INVALID)
        snapshot = candidate.snapshot
    # Compared with the active revision: with several Edges it may be newer than what this
    # Edge runs until its watcher catches up (R-SCALE-3); with one Edge they are the same.
    base = active.document if active is not None else runtime.snapshot.document
    report = diff_report(base, snapshot.document, mode=APPLY, outcome="applied")
    report = with_ids(report, revision, active)
    if report.restart_required_paths:
        refused = report.but(outcome="refused_restart_required")
        log.warning(
            "revision %s from %s refused: %d restart-required path(s)",
            revision.pk,
            actor,
            len(refused.restart_required_paths),
        )
        return _refuse(revision, refused, RESTART_REQUIRED)
    revision.mark_active(active, actor)
    _save(revision, report, "is_active", "applied_at", "applied_by")
    # The catalog shows what runs: an applied document replaces it (docs/refresh.md).
    _sync_catalog(snapshot.document)
    return _Committed(revision, active, snapshot, report)


def _swap(runtime: RunningEdge, committed: _Committed | Outcome, actor: str) -> Outcome:
    """Commit first, swap second: the rows say what runs once the swap succeeds; when it fails
    the Edge keeps the old snapshot and the rows are put back (the revision marked failed)."""
    if isinstance(committed, Outcome):
        return committed
    revision = committed.revision
    try:
        # The swap runs on the Edge's event loop (pool re-evaluation, Node pushes).
        outcome = async_to_sync(runtime.apply)(committed.snapshot, revision=revision.pk)
    except Exception as exc:
        return _swap_failed(runtime, committed, actor, exc)
    # ``active`` is the revision that runs (docs/refresh.md): after an apply, this one.
    report = committed.report.but(
        applied=True, pushed_nodes=tuple(outcome.pushed_nodes), active=revision.pk
    )
    _save(revision, report)
    log.info(
        "revision %s applied by %s: %d live path(s), pushed to %s",
        revision.pk,
        actor,
        len(report.live_paths),
        ", ".join(report.pushed_nodes) or "no node",
    )
    return Outcome(report, OK, revision)


def _swap_failed(
    runtime: RunningEdge, committed: _Committed, actor: str, exc: Exception
) -> Outcome:
    revision, previous = committed.revision, committed.previous
    keeps = f"revision {previous.pk}" if previous is not None else "its previous configuration"
    message = f"the running Edge could not install revision {revision.pk}; it keeps running {keeps}"
    log.error("%s (apply by %s failed: %s)", message, actor, type(exc).__name__)
    report = committed.report.but(
        outcome="failed",
        applied=False,
        errors=({"path": "<root>", "message": message},),
        active=previous.pk if previous is not None else None,
    )
    with transaction.atomic():
        revision.mark_failed(previous)
        _save(revision, report)
        _sync_catalog(runtime.snapshot.document)  # the catalog shows what still runs
    return Outcome(report, SWAP_FAILED, revision)


def _sync_catalog(document: dict[str, Any]) -> None:
    from catalog.documents import catalog_to_document, document_to_catalog

    if catalog_to_document() != document:
        document_to_catalog(document)


def _check(revision: ConfigRevision, active: ConfigRevision | None, mode: str) -> Outcome | None:
    """Refuse a revision that is already active or built on a parent that is no longer active."""
    active_id = active.pk if active else None
    if revision.is_active:
        message = f"revision {revision.pk} is already the active revision"
        report = error_report(mode, "refused_already_active", [("<root>", message)])
        return Outcome(with_ids(report, revision, active), STALE, revision)
    if revision.parent_id != active_id:
        report = stale(mode, f"revision {revision.pk}", revision.parent_id, active_id)
        return _refuse(revision, with_ids(report, revision, active), STALE)
    return None


def _refuse(revision: ConfigRevision, report: Report, status: int) -> Outcome:
    revision.state = ConfigRevision.State.REFUSED
    _save(revision, report)
    return Outcome(report, status, revision)


def _save(revision: ConfigRevision, report: Report, *fields: str) -> None:
    revision.report = report.as_dict()
    if revision.pk is None:
        revision.save()
    else:
        revision.save(update_fields=["report", "state", *fields])


def _label(actor: Any) -> str:
    if isinstance(actor, str):
        return actor
    if actor is not None and getattr(actor, "is_authenticated", False):
        return str(actor.get_username())
    return "anonymous"
