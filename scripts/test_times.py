"""Where `make test`'s time goes, from the JUnit XML of a run or the JSON lines that
``IOP_TEST_TIMES=FILE`` collects (tests/support/timing.py; docs/testing.md).

    .venv/bin/pytest -n 2 --dist loadfile -o junit_duration_report=total \\
        --junitxml=var/junit.xml -m "not serial"
    .venv/bin/python scripts/test_times.py var/junit.xml            # the table
    .venv/bin/python scripts/test_times.py var/junit.xml --write    # tests/module_times.json

Per module: wall seconds (JUnit's ``time``, setup and teardown included) and CPU seconds of
the test process and its reaped children (``cpu_s``, tests.support.timing), summed over its
tests; per worker: its busy time and when its last test ended. ``--workers N`` replays the
order the suite hands modules out in (tests/conftest.py: the longest first, by
tests/module_times.json and tests/support/schedule.py: longest first, the modules that
mostly wait spread among the others) on N workers with these wall times: the makespan that
order gives and the longest module, which no schedule beats. ``--write`` stores the wall and
CPU seconds per module, rounded to a second, for that order.
"""

from __future__ import annotations

import argparse
import collections
import heapq
import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.schedule import MODULE_TIMES, Times, order, read_times, write_times  # noqa: E402


def module_of(classname: str) -> str:
    """``tests.test_x`` or ``tests.test_x.TestClass`` -> ``tests/test_x.py``."""
    parts = classname.split(".")
    return "/".join(parts[:2]) + ".py"


def _cases(path: Path) -> Iterator[tuple[str, float, dict[str, Any]]]:
    """(module, wall, properties) of each test: a JUnit XML, or the JSON lines of
    ``IOP_TEST_TIMES`` (tests/support/timing.py)."""
    if path.suffix == ".jsonl":
        for text in path.read_text().splitlines():
            line = json.loads(text)
            props = {"cpu_s": line["cpu"], "worker": line["worker"], "started": line["started"]}
            yield line["test"].split("::", 1)[0], float(line["wall"]), props
        return
    for case in ET.parse(path).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        yield module_of(case.get("classname", "")), float(case.get("time", 0)), props


def read(path: Path) -> dict[str, dict[str, float]]:
    """Per module: tests, wall, cpu, and (per worker) first start and last end."""
    modules: dict[str, dict[str, float]] = collections.defaultdict(
        lambda: {"tests": 0, "wall": 0.0, "cpu": 0.0}
    )
    workers: dict[str, dict[str, float]] = {}
    for module, wall, props in _cases(path):
        row = modules[module]
        row["tests"] += 1
        row["wall"] += wall
        row["cpu"] += float(props.get("cpu_s") or 0)
        if "worker" in props and "started" in props:
            worker = workers.setdefault(
                str(props["worker"]), {"busy": 0.0, "first": float("inf"), "last": 0.0}
            )
            started = float(props["started"])
            worker["busy"] += wall
            worker["first"] = min(worker["first"], started)
            worker["last"] = max(worker["last"], started + wall)
    return {"modules": dict(modules), "workers": workers}  # type: ignore[dict-item]


def replay(walls: dict[str, float], times: Times, workers: int) -> float:
    """The makespan of handing modules out in `make test`'s order (by ``times``; unknown ones
    last in file order) to whichever of ``workers`` is free first, with the measured ``walls``."""
    free = [0.0] * workers
    for module in order(sorted(walls), times):
        start = heapq.heappop(free)
        heapq.heappush(free, start + walls[module])
    return max(free)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", type=Path)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--write", action="store_true", help=f"write {MODULE_TIMES.name}")
    args = parser.parse_args(argv)
    data = read(args.junit)
    modules = data["modules"]
    walls = {m: row["wall"] for m, row in modules.items()}
    total_wall = sum(walls.values())
    total_cpu = sum(row["cpu"] for row in modules.values())
    tests = sum(int(row["tests"]) for row in modules.values())
    print(f"{tests} tests, {len(modules)} modules: {total_wall:.0f} s wall, {total_cpu:.0f} s CPU")
    for name, worker in sorted(data["workers"].items()):
        span = worker["last"] - worker["first"]
        print(f"  {name}: busy {worker['busy']:.0f} s, first test to last end {span:.0f} s")
    print(f"top {args.top} by wall time:   wall     cpu  tests")
    for module in sorted(modules, key=lambda m: -walls[m])[: args.top]:
        row = modules[module]
        print(f"  {module:46} {row['wall']:6.1f}  {row['cpu']:6.1f}  {int(row['tests']):5d}")
    measured: Times = {m: (row["wall"], row["cpu"]) for m, row in modules.items()}
    if args.write:
        count = write_times(measured)
        print(f"wrote {MODULE_TIMES.relative_to(ROOT)} ({count} modules)")
    times = read_times() or measured
    longest = max(walls.values(), default=0.0)
    for n in sorted({args.workers, args.workers + 1}):
        print(
            f"replayed on {n} workers, in make test's order: {replay(walls, times, n):.0f} s"
            f" (the sum over {n}: {total_wall / n:.0f} s; the longest module: {longest:.0f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
