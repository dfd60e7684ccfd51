"""The collector around a process's start: the Edge and the Node (docs/performance-history.md,
"The long tail"; docs/testing.md, "Cheaper start-ups").

While a process starts, nearly everything it allocates (modules, settings, the config
snapshot, the app) lives as long as the process, so collecting during the imports walks a
growing heap for almost nothing: about a tenth of an Edge's start-up CPU (a Node's gain is
smaller: its package loads before the hold).
``collector_paused()`` holds the collector from the first import; ``settle_heap()``, once the
process is built, collects once, moves every survivor to the permanent generation (a later
full collection walks only what requests created, so its pause is short) and lets the
collector run again.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic collection inside, unless ``settle_heap()`` turns it back on; on the way
    out the collector runs as it did before (however the block ends)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def settle_heap() -> int:
    """Collect once, freeze every surviving object and turn the collector on; returns how
    many objects were frozen."""
    gc.collect()
    gc.freeze()
    gc.enable()
    return gc.get_freeze_count()
