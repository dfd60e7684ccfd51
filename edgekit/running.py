"""The handle on the Edge running in this process, for Django views (docs/architecture.md).

``iop_site`` builds the runtime and attaches it at start; the refresh admin, the REST API
and the status pages read it here, so no app imports ``iop_site`` back. Without a running
Edge (``manage.py`` commands, a Django-only process) there is none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from catalog.config import EdgeSnapshot


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    pushed_nodes: tuple[str, ...]


class RunningEdge(Protocol):
    """What the Django side may do with the running Edge."""

    @property
    def snapshot(self) -> EdgeSnapshot: ...

    async def apply(
        self, snapshot: EdgeSnapshot, *, revision: int | None = None
    ) -> ApplyOutcome: ...

    async def pool_status(self) -> dict[str, Any]: ...

    def credentials_changed(self) -> None: ...


class EdgeNotRunning(RuntimeError):
    """No Edge runtime runs in this process."""


class _Slot:
    """Holds the one runtime of this process; ``iop_site.server.serve`` fills it at start."""

    __slots__ = ("runtime",)

    def __init__(self) -> None:
        self.runtime: RunningEdge | None = None


_slot = _Slot()


def attach_runtime(runtime: RunningEdge | None) -> None:
    _slot.runtime = runtime


def running_edge() -> RunningEdge | None:
    """The Edge runtime of this process, or None when only Django runs here."""
    return _slot.runtime


def get_runtime() -> RunningEdge:
    runtime = _slot.runtime
    if runtime is None:
        raise EdgeNotRunning("the Edge runtime is not running in this process")
    return runtime
