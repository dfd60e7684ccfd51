"""Loaded by the Edge and the Node of a benchmark run with ``--diagnose`` (on PYTHONPATH).

``IOP_BENCH_GC_LOG=FILE``: time every collector pass with ``gc.callbacks`` and write, at
exit, per generation: passes, total and longest pause (wall ms, and the collector's own CPU
ms, which other work on the machine does not inflate), how many took over 1 ms, and every
pause over 2 ms with its time since start.
``IOP_BENCH_UNDO=gc``: make ``gc.freeze`` and ``gc.set_threshold`` no-ops, to measure a
process as it was before the heap was settled (docs/performance-history.md).
``IOP_BENCH_GC_THRESHOLD=A,B,C``: start with these collector thresholds.
``IOP_BENCH_ASYNCIO_IN=edge`` (or ``node``, or both): that process runs on asyncio's own
loop instead of uvloop (``IOP_EVENT_LOOP=asyncio`` for it alone, nodes/loop.py).
``IOP_BENCH_OBJECTS=FILE``: on SIGUSR2, count the objects the collector tracks, and their own
sizes, by type (a coroutine, a function and a bound method by its name too), into
``FILE.<pid>.<n>`` (what an open stream keeps: docs/performance-history.md).
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import sys
import time
from typing import Any

if os.environ.get("IOP_BENCH_GC_THRESHOLD"):
    gc.set_threshold(*(int(n) for n in os.environ["IOP_BENCH_GC_THRESHOLD"].split(",")))
_argv = " ".join(sys.orig_argv)
_role = "node" if "nodes.agent.main" in _argv or "iop-node" in _argv else "edge"
if _role in os.environ.get("IOP_BENCH_ASYNCIO_IN", "").split(","):
    os.environ["IOP_EVENT_LOOP"] = "asyncio"  # read by nodes.loop.install at start
if os.environ.get("IOP_BENCH_UNDO") == "gc":
    gc.freeze = lambda: None
    gc.set_threshold = lambda *args: None  # type: ignore[assignment]

_path = os.environ.get("IOP_BENCH_GC_LOG")
if _path:
    _started: list[float] = [0.0, 0.0]
    _t0 = time.monotonic()
    _long: list[tuple[float, int, float, float]] = []  # (s since start, gen, ms, CPU ms)
    _stats: dict[int, dict[str, float]] = {
        gen: {
            "passes": 0,
            "total_ms": 0.0,
            "max_ms": 0.0,
            "over_1ms": 0,
            "cpu_ms": 0.0,
            "max_cpu_ms": 0.0,
        }
        for gen in range(3)
    }

    def _time(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            _started[:] = [time.perf_counter(), time.thread_time()]
            return
        ms = (time.perf_counter() - _started[0]) * 1000
        cpu_ms = (time.thread_time() - _started[1]) * 1000
        gen = _stats[info["generation"]]
        gen["passes"] += 1
        gen["total_ms"] += ms
        gen["cpu_ms"] += cpu_ms
        gen["max_cpu_ms"] = max(gen["max_cpu_ms"], cpu_ms)
        gen["max_ms"] = max(gen["max_ms"], ms)
        gen["over_1ms"] += ms > 1.0
        if ms > 2.0 and len(_long) < 500:
            since = round(time.monotonic() - _t0, 2)
            _long.append((since, info["generation"], round(ms, 1), round(cpu_ms, 1)))

    def _write() -> None:
        with open(f"{_path}.{os.getpid()}", "w") as out:
            json.dump(
                {
                    "argv": sys.argv[:3],
                    "gc": _stats,
                    "frozen": gc.get_freeze_count(),
                    "threshold": gc.get_threshold(),
                    "long": _long,
                },
                out,
            )

    gc.callbacks.append(_time)
    atexit.register(_write)

_objects = os.environ.get("IOP_BENCH_OBJECTS")
if _objects:
    import signal
    from collections import Counter

    _dumps = [0]

    def _dump_objects(signum: int, frame: Any) -> None:
        """Count the heap's objects and their own sizes by type into ``FILE.<pid>.<n>``."""
        counts: Counter[str] = Counter()
        sizes: Counter[str] = Counter()
        for obj in gc.get_objects():
            name = type(obj).__qualname__
            if name in ("coroutine", "function", "method"):  # the await chain, the callbacks
                function = obj.__func__ if name == "method" else obj
                name = f"{name} {getattr(function, '__qualname__', '?')}"
            counts[name] += 1
            sizes[name] += sys.getsizeof(obj)
        _dumps[0] += 1
        with open(f"{_objects}.{os.getpid()}.{_dumps[0]}", "w") as out:
            json.dump({"counts": counts, "bytes": sizes}, out)

    signal.signal(signal.SIGUSR2, _dump_objects)
