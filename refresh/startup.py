"""Which snapshot the Edge starts with: the active revision, after staged and file changes.

Order at start: a revision staged for restart becomes active (when it was built on the active
one); then ``runedge --config FILE`` makes FILE the active revision when its canonical document
differs (config as code); with nothing active and no file, the catalog (or, when the catalog is
empty, ``settings.IOP_CONFIG_FILE``) becomes the first revision.

R-CFG-14: all of it happens in one transaction that also runs the start's own checks on the
snapshot it would start with; a check that refuses the start rolls every write back, so a
refused configuration is never recorded or activated, and "is now active" is logged only
after the commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from django.conf import settings
from django.db import transaction

from catalog.config import ConfigError, EdgeSnapshot, load_file, load_snapshot
from refresh.models import ConfigRevision, active_for_change
from refresh.report import diff_report, error_report

log = logging.getLogger("iop.refresh")
Source = ConfigRevision.Source
Checked = TypeVar("Checked")


def startup_snapshot(config_file: str | None) -> EdgeSnapshot:
    """The snapshot to start with; raise ConfigError (every issue by path) when it is invalid."""
    return startup_revision(config_file)[0]


def startup_revision(config_file: str | None) -> tuple[EdgeSnapshot, int]:
    """The snapshot to start with and the id of its (now active) revision."""
    return checked_start(config_file, lambda snapshot: snapshot)


def checked_start(
    config_file: str | None, check: Callable[[EdgeSnapshot], Checked]
) -> tuple[Checked, int]:
    """``check``'s result for the snapshot to start with, and the id of its (now active)
    revision. ``check`` raises to refuse the start: then nothing is recorded (R-CFG-14)."""
    promoted: list[str] = []
    with transaction.atomic():
        active = active_for_change()
        active = activate_staged(active, promoted)
        if config_file:
            snapshot = load_file(config_file)
            if active is None or active.digest != snapshot.digest:
                label = f"runedge --config {config_file}"
                active = _activate(snapshot, active, Source.CONFIG_FILE, label, promoted)
        elif active is None:
            snapshot, source, label = _first_config()
            active = _activate(snapshot, None, source, label, promoted)
        checked = check(load_snapshot(active.document))
        _seed_catalog(active)  # under the lock: two Edges starting at once seed it once
    for line in promoted:
        log.info("%s", line)
    log.info("starting with revision %s", active.pk)
    return checked, active.pk


def activate_staged(active: ConfigRevision | None, promoted: list[str]) -> ConfigRevision | None:
    """Make the newest staged revision active if it still fits; refuse it otherwise."""
    staged = ConfigRevision.objects.filter(state=ConfigRevision.State.STAGED).order_by("-id")
    revision = staged.first()
    if revision is None:
        return active
    active_id = active.pk if active else None
    problem = outcome = None
    if revision.parent_id != active_id:
        outcome = "refused_stale_parent"
        problem = (
            f"revision {revision.pk} was built on revision {revision.parent_id}, but the "
            f"active revision is {active_id}"
        )
    else:
        try:
            snapshot = load_snapshot(revision.document)
        except ConfigError as exc:
            outcome = "invalid"
            problem = f"the document no longer loads: {len(exc.issues)} issue(s)"
    if problem is not None:
        log.warning("staged %s not activated: %s", revision, problem)
        report = error_report("startup", str(outcome), [("<root>", problem)])
        revision.state = ConfigRevision.State.REFUSED
        revision.report = report.but(
            revision=revision.pk, parent=revision.parent_id, active=active_id
        ).as_dict()
        revision.save(update_fields=["state", "report"])
        return active
    return _promote(revision, snapshot, active, "runedge (staged revision)", promoted)


def _activate(
    snapshot: EdgeSnapshot,
    active: ConfigRevision | None,
    source: str,
    label: str,
    promoted: list[str],
) -> ConfigRevision:
    revision = ConfigRevision.objects.create(
        document=snapshot.document,
        digest=snapshot.digest,
        parent=active,
        source=source,
        author_label=label,
    )
    return _promote(revision, snapshot, active, label, promoted)


def _promote(
    revision: ConfigRevision,
    snapshot: EdgeSnapshot,
    active: ConfigRevision | None,
    label: str,
    promoted: list[str],
) -> ConfigRevision:
    """Make ``revision`` the active one (the Edge has not started yet: nothing to push); the
    line saying so is ``promoted``'s, logged once the start's checks passed."""
    report = diff_report(
        active.document if active else None, snapshot.document, mode="startup", outcome="applied"
    )
    revision.mark_active(active, label)
    revision.report = report.but(
        applied=True, revision=revision.pk, parent=revision.parent_id, active=revision.pk
    ).as_dict()
    revision.save()
    promoted.append(f"revision {revision.pk} is now active ({label})")
    return revision


def _first_config() -> tuple[EdgeSnapshot, str, str]:
    """Nothing active and no file: the catalog, or the configured file when it is empty."""
    from catalog.documents import catalog_is_empty, catalog_to_document

    fallback = getattr(settings, "IOP_CONFIG_FILE", "")
    if catalog_is_empty() and fallback and Path(fallback).is_file():
        return load_file(fallback), Source.CONFIG_FILE, f"runedge (IOP_CONFIG_FILE {fallback})"
    return load_snapshot(catalog_to_document()), Source.CATALOG, "runedge (catalog)"


def _seed_catalog(active: ConfigRevision) -> None:
    """An empty catalog gets the running document, so operators edit what runs."""
    from catalog.documents import catalog_is_empty, document_to_catalog

    if catalog_is_empty():
        document_to_catalog(active.document)
