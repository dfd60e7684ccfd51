"""`scripts/e2e-provider-capacity-smoke.sh` runs green as part of `make test`.

Two model aliases share one capacity-1 provider: every request completes, the upstream never
sees two at once, and the pool ends idle (R-CFG-8, R-POOL-2, R-POOL-9).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support import ROOT

SCRIPT = ROOT / "scripts" / "e2e-provider-capacity-smoke.sh"


@pytest.mark.slow
def test_capacity_smoke_script_passes_every_check() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    result = subprocess.run(
        ["bash", str(SCRIPT), "--requests", "8"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 6 and all(line.startswith("ok ") for line in lines), result.stdout
    assert "upstream peak concurrency 1 " in result.stdout
