"""Where a test run's time goes, per test, into the JUnit XML a run writes with ``--junitxml``
(``scripts/test_times.py`` sums it per module and replays the schedule; docs/testing.md).

Each test case gets three properties: ``cpu_s``, the CPU seconds (user + system) of the test
process and of every child process it reaped (an Edge, a Node, a ``make run`` copy, a
browser) from the test's setup to its teardown, module fixtures included (their teardown
counts towards a module's last test); ``worker``, the xdist worker that ran it; and
``started``, the wall-clock time its setup began (seconds since the epoch). Wall time stays
JUnit's own ``time`` attribute (run with ``-o junit_duration_report=total``).

With ``IOP_TEST_TIMES=FILE`` in the environment each test also appends one JSON line to FILE
(``test``, ``wall``, ``cpu``, ``worker``, ``started``): every pytest run of a `make test`
(database, parallel, serial) into one file, e.g. ``IOP_TEST_TIMES=var/times.jsonl make
test``."""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Generator

import pytest

_STARTED = pytest.StashKey[tuple[float, float]]()
TIMES_ENV = "IOP_TEST_TIMES"


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_STARTED] = (time.time(), _cpu_s())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    if call.when == "teardown" and _STARTED in item.stash:
        started, cpu = item.stash[_STARTED]
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        item.user_properties.append(("cpu_s", f"{_cpu_s() - cpu:.3f}"))
        item.user_properties.append(("worker", worker))
        item.user_properties.append(("started", f"{started:.3f}"))
        if os.environ.get(TIMES_ENV):  # one JSON line per test, appended by every run
            line = {"test": item.nodeid, "wall": round(time.time() - started, 3)}
            line.update(cpu=round(_cpu_s() - cpu, 3), worker=worker, started=round(started, 3))
            with open(os.environ[TIMES_ENV], "a") as out:
                out.write(json.dumps(line) + "\n")
    return (yield)
