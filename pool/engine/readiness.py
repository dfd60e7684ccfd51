"""Which connection generation of each Node is dispatch-ready (R-NODE-1, R-TLS-3).

One rule for both engines: the newest connection wins, and a stale generation (one that
already ended, or older than the ready one) changes nothing. Plain dicts, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping


class Readiness:
    """Ready generation and refused providers per Node, and the newest generation gone."""

    __slots__ = ("gone", "ready", "refused")

    def __init__(self) -> None:
        self.ready: dict[str, int] = {}  # node -> dispatch-ready generation
        self.gone: dict[str, int] = {}  # node -> newest generation known to have ended
        self.refused: dict[str, dict[str, str]] = {}  # ready node -> provider -> why

    def mark_ready(self, node_id: str, generation: int, refused: Mapping[str, str] | None) -> bool:
        """True when this generation became the ready one; False for a stale generation."""
        gone = self.gone.get(node_id)
        current = self.ready.get(node_id)
        if (gone is not None and generation <= gone) or (
            current is not None and generation < current
        ):
            return False  # that connection already ended or was replaced
        self.ready[node_id] = generation
        self.refused[node_id] = dict(refused or {})
        return True

    def mark_refused(self, node_id: str, generation: int, refused: Mapping[str, str]) -> bool:
        """True when the ready generation now refuses exactly ``refused`` (a change)."""
        if self.ready.get(node_id) != generation or self.refused.get(node_id) == refused:
            return False
        self.refused[node_id] = dict(refused)
        return True

    def mark_gone(self, node_id: str, generation: int) -> bool:
        """True when the ready generation ended (an older one ending changes nothing)."""
        current = self.ready.get(node_id)
        if current is not None and generation < current:
            return False
        self.gone[node_id] = max(generation, self.gone.get(node_id, generation))
        if current is None:
            return False  # was not ready: nothing was live
        del self.ready[node_id]
        self.refused.pop(node_id, None)
        return True
