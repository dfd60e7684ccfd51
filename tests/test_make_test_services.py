"""`make test` picks its real services (scripts/test_services.py): an IOP_TEST_* variable
already set wins, an empty one turns its group off, and one line names what is skipped."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.processes import ROOT

SCRIPT = ROOT / "scripts" / "test_services.py"


def services(**env: str) -> dict[str, str]:
    """The script's assignments, as the Makefile's shell would evaluate them."""
    out = subprocess.run(
        [sys.executable, str(SCRIPT)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    shell = (
        f'{out}\nprintf "%s\\n" "$IOP_TEST_DATABASE_URL" "$IOP_TEST_REDIS_URL" "$IOP_TEST_SKIPPED"'
    )
    lines = subprocess.run(
        ["bash", "-c", shell], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    return dict(zip(("database", "redis", "skipped"), lines, strict=True))


def test_explicit_variables_win_and_an_empty_one_is_named_as_the_reason():
    chosen = services(IOP_TEST_DATABASE_URL="postgresql://u@db.example/x", IOP_TEST_REDIS_URL="")
    assert chosen["database"] == "postgresql://u@db.example/x"
    assert chosen["redis"] == ""
    assert chosen["skipped"].startswith("skipped: ")
    assert "Redis tests (IOP_TEST_REDIS_URL is empty)" in chosen["skipped"]
    assert "PostgreSQL" not in chosen["skipped"]
    assert len(chosen["skipped"].splitlines()) == 1
