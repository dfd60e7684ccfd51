"""Settle the collector once a process has started: the Edge and the Node
(docs/performance-history.md, "The long tail").

Everything alive after startup (modules, settings, the config snapshot, the app) lives as
long as the process. Moving it to the collector's permanent generation means a later full
collection walks only what requests created, so its pause is short.
"""

from __future__ import annotations

import gc


def settle_heap() -> int:
    """Collect once, then freeze every surviving object; returns how many were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
