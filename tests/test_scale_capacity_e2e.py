"""docs/scale-out.md "Capacity plan of one Redis" (R-HA-5): the page's command runs as
written (short rows) and prints its table: every simulated request is two scripts (admit,
release), sharing round trips."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.support.journeys import journey_blocks
from tests.support.processes import ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]


def test_the_capacity_plan_command_prints_its_table_r_ha_5() -> None:
    command = journey_blocks(ROOT / "docs" / "scale-out.md")["scale-capacity"]
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=ROOT,
        env={**os.environ, "IOP_CAPACITY_SECONDS": "0.3"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line[:3] == "| 1"
            or line.startswith(("| 2 ", "| 4 ", "| 8 "))]  # fmt: skip
    assert len(rows) == 6, done.stdout
    for row in rows:
        scripts, trips = float(row[4]), float(row[6])
        assert 2.0 <= scripts < 2.1 and 0 < trips < 1  # two scripts a request, shared trips
