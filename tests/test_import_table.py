"""docs/architecture.md's import count, run as the page writes it: one row per package pair
that imports another, and the pairs imported both ways marked."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.support import ROOT
from tests.support.journeys import doc_blocks


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
def test_the_architecture_pages_import_table_command_counts_the_package_imports() -> None:
    block = doc_blocks(ROOT / "docs" / "architecture.md", "doc")["import-table"]
    done = subprocess.run(
        ["bash", "-e", "-c", block], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[:-1] if line.strip()]
    pairs = {(row[0], row[1]): int(row[2]) for row in rows if len(row) >= 3 and row[2].isdigit()}
    assert pairs[("iop_site", "pool.http")] > 0  # the composition layer imports the surface
    assert ("pool.engine", "pool.http") not in pairs  # the engine never imports the surface
    total = re.fullmatch(
        r"pairs: (\d+)  imports: (\d+)  cycles: (\d+)", done.stdout.splitlines()[-1]
    )
    assert total is not None and int(total.group(1)) == len(pairs)
    assert int(total.group(2)) == sum(pairs.values())
