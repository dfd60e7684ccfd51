"""Child processes of a stack: environment, the migrated database template, log files."""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.support.ports import free_port as free_port  # also imported from here

ROOT = Path(__file__).resolve().parent.parent.parent
EDGE_YAML = ROOT / "configs" / "edge.yaml"  # the shipped example config
STOP_TIMEOUT_S = 10.0


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without Django/pytest settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra or {})
    return env


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Children started inside inherit SIGINT ignored, as a script's background job does (a
    shell without job control starts it so): a command documented to stop on Ctrl-C must
    take SIGINT itself. From the main thread only."""
    inherited = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, inherited)


@functools.cache
def migrated_template(root: Path = ROOT) -> Path:
    """A migrated SQLite database, built once per session (per checkout ``root``: a bench
    baseline has its own migrations) and copied by each Stack."""
    directory = Path(tempfile.mkdtemp(prefix="iop-db-template-"))
    atexit.register(shutil.rmtree, directory, True)
    path = directory / "template.sqlite3"
    env = child_env(
        {
            "DATABASE_URL": f"sqlite:///{path}",
            "IOP_VAR_DIR": str(directory / "var"),
            "PYTHONPATH": str(root),
        }
    )
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0", "--skip-checks"],
        cwd=root,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return path


class Proc:
    """A child process with its output in a log file."""

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], log: Path, cwd: Path = ROOT
    ) -> None:
        self.name, self.argv, self.env, self.log, self.cwd = name, argv, env, log, cwd
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        handle = self.log.open("ab")
        try:
            self.popen = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            handle.close()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        stop_all([self], sig)


def stop_all(procs: list[Proc], sig: int = signal.SIGTERM) -> None:
    """Signal every running one of ``procs`` at once, then wait for each (SIGKILL after
    ``STOP_TIMEOUT_S``): they stop side by side, not one after another."""
    running = [proc.popen for proc in procs if proc.popen is not None]
    for popen in running:
        if popen.poll() is None:
            popen.send_signal(sig)
    for popen in running:
        try:
            popen.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(STOP_TIMEOUT_S)
    for proc in procs:
        proc.popen = None
