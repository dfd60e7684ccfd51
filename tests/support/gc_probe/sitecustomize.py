"""Put on the PYTHONPATH of a test's Edge or Node with ``IOP_TEST_GC_PASSES=PREFIX``: each
collector pass appends its generation, one line, to ``PREFIX.edge.<pid>`` or
``PREFIX.node.<pid>`` as it starts, so a test reads what ran while the process served
(tests/test_heap.py)."""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

_prefix = os.environ.get("IOP_TEST_GC_PASSES")
if _prefix:
    _role = "edge" if "runedge" in sys.orig_argv else "node"
    _path = f"{_prefix}.{_role}.{os.getpid()}"

    def _note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            with open(_path, "a") as out:
                out.write(f"{info['generation']}\n")

    gc.callbacks.append(_note)
