"""The order `make test` hands its modules out in (tests/conftest.py, scripts/test_times.py;
docs/testing.md, "Longest module first, waiting ones spread").

Each module's measured wall and CPU seconds are in tests/module_times.json. A module that
spends most of its wall time waiting (on a timeout, a failover, a flush interval) leaves its
worker's core to the others; when several of them run at once, cores idle. So the modules
are split in two, those that wait and those that work, each longest first, and merged so
that the waiting ones are spread over the run in proportion to their time. A module missing
from the file comes last, in collection order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

MODULE_TIMES = Path(__file__).resolve().parent.parent / "module_times.json"
WAITING_SHARE = 0.4  # CPU below this share of the wall time: a module that mostly waits

Times = dict[str, tuple[float, float]]  # module -> (wall s, CPU s)


def read_times(path: Path = MODULE_TIMES) -> Times:
    """tests/module_times.json: ``{"tests/test_x.py": [wall, cpu], ...}``."""
    if not path.exists():
        return {}
    return {
        module: (float(v[0]), float(v[1])) for module, v in json.loads(path.read_text()).items()
    }


def write_times(times: Times, path: Path = MODULE_TIMES) -> int:
    """Store the times rounded to a second (modules under half a second left out); how many."""
    rows = [
        f"{json.dumps(m)}: [{round(w)}, {round(c)}]"
        for m, (w, c) in sorted(times.items())
        if round(w) > 0
    ]
    path.write_text("{\n" + ",\n".join(rows) + "\n}\n")  # one module a line
    return len(rows)


def order(modules: Iterable[str], times: Times) -> list[str]:
    """``modules`` (in collection order) in the order to hand them out."""
    modules = list(dict.fromkeys(modules))
    known = [m for m in modules if m in times]
    waiting = sorted(
        (m for m in known if times[m][1] < WAITING_SHARE * times[m][0]),
        key=lambda m: -times[m][0],
    )
    working = sorted((m for m in known if m not in waiting), key=lambda m: -times[m][0])
    totals = [sum(times[m][0] for m in part) or 1.0 for part in (working, waiting)]
    taken = [0.0, 0.0]
    merged: list[str] = []
    while working or waiting:
        # the part that has handed out the smaller share of its time goes next
        part = 1 if waiting and (not working or taken[1] / totals[1] < taken[0] / totals[0]) else 0
        module = (working, waiting)[part].pop(0)
        taken[part] += times[module][0]
        merged.append(module)
    return merged + [m for m in modules if m not in times]
