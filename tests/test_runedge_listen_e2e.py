"""``runedge`` on a port already in use: a non-zero exit that names the port and the cause."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.processes import EDGE_YAML, ROOT, child_env, free_port, migrated_template

pytestmark = pytest.mark.slow


def test_runedge_exits_non_zero_naming_the_port_when_another_process_holds_it(
    tmp_path: Path,
) -> None:
    """A supervisor must see a failed start: exit 1, never the ready line (docs/journeys.md).
    R-CFG-14: the port is found taken before the start activates anything, so the refused
    configuration is never recorded as a revision."""
    db = tmp_path / "edge.sqlite3"
    shutil.copyfile(migrated_template(), db)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        document = yaml.safe_load(EDGE_YAML.read_text())
        document["edge"].update(listen=f"127.0.0.1:{port}", bootstrap_dir=str(tmp_path / "b"))
        document["admin"]["listen"] = f"127.0.0.1:{free_port()}"
        document["openai"]["listen"] = f"127.0.0.1:{free_port()}"
        config = tmp_path / "edge.yaml"
        config.write_text(yaml.safe_dump(document))
        done = subprocess.run(
            [sys.executable, "manage.py", "runedge", "--config", str(config)],
            cwd=ROOT,
            env=child_env({"DATABASE_URL": f"sqlite:///{db}", "IOP_VAR_DIR": str(tmp_path)}),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "IOP Edge ready" not in done.stdout
    assert f"127.0.0.1:{port}" in done.stderr and "Address already in use" in done.stderr
    assert "is another Edge already running on these ports?" in done.stderr
    assert "is now active" not in done.stdout + done.stderr
    export = subprocess.run(
        [sys.executable, "manage.py", "iop_config", "export", "--revision", "active"],
        cwd=ROOT,
        env=child_env({"DATABASE_URL": f"sqlite:///{db}", "IOP_VAR_DIR": str(tmp_path)}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert export.returncode != 0 and "no revision is active" in export.stderr, export
