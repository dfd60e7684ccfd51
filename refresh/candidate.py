"""A candidate document checked by the loader, and the outcome every refresh call returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from catalog import config
from catalog.config.errors import ConfigError
from refresh.report import Report, error_report

if TYPE_CHECKING:
    from catalog.config import EdgeSnapshot
    from refresh.models import ConfigRevision

DRY_RUN, APPLY, STAGE, CREATE, DIFF = "dry_run", "apply", "stage", "create", "diff"
# The HTTP status each outcome maps to at the edges (REST API, admin messages, /refresh).
OK, INVALID, RESTART_REQUIRED, STALE, NO_RUNTIME = 200, 400, 409, 409, 503
SWAP_FAILED = 500  # committed, but the running Edge could not install it (docs/refresh.md)


@dataclass(frozen=True, slots=True)
class Outcome:
    """A report, the HTTP status the edges answer with, and the revision row if one exists."""

    report: Report
    status: int
    revision: ConfigRevision | None = None

    @property
    def body(self) -> dict[str, Any]:
        return self.report.as_dict()


class Candidate:
    """A validated candidate document: its snapshot, or the report of why it is invalid."""

    def __init__(self, document: Any, mode: str) -> None:
        self.snapshot: EdgeSnapshot | None = None
        self.refusal: Report | None = None
        if not isinstance(document, Mapping):
            self.refusal = error_report(mode, "invalid", [("<root>", "must be a mapping")])
            return
        try:
            self.snapshot = config.load_snapshot(document)
        except ConfigError as exc:
            issues = [(issue.path, issue.message) for issue in exc.issues]
            self.refusal = error_report(mode, "invalid", issues, document)


def stale(mode: str, what: str, parent: int | None, active: int | None) -> Report:
    message = (
        f"{what} was built on revision {parent}, but the active revision is {active}; "
        "create a new candidate from the active revision"
    )
    return error_report(mode, "refused_stale_parent", [("<root>", message)]).but(
        parent=parent, active=active
    )


def no_runtime(revision: ConfigRevision | None = None) -> Outcome:
    message = "the Edge runtime is not running in this process"
    return Outcome(error_report(APPLY, "no_runtime", [("<root>", message)]), NO_RUNTIME, revision)


def with_ids(report: Report, revision: ConfigRevision, active: ConfigRevision | None) -> Report:
    return report.but(
        revision=revision.pk, parent=revision.parent_id, active=active.pk if active else None
    )
