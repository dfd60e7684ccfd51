"""The package index of the tests' other machines.

Three tests run a documented install for real, in a fresh venv: docs/journeys.md's and
docs/node.md's ``pip install .`` (the Node) and docs/scale-out.md's ``pip install -e
'.[edge,postgres]'``. The pip that ``python3 -m venv`` bundles spends most of such an
install's CPU matching the 60,000 files the index lists for the project's dependencies
against its platform's tags. So the project's dependencies are resolved against the real
index once per machine and dependency list, with this checkout's pip, into a directory of
wheels (``make test`` starts that beside its checks), and every documented install runs as
written against that directory alone (``PIP_NO_INDEX``, ``PIP_FIND_LINKS``), as on a
machine with a local mirror. CPU, measured: the Node's install 20.5 s from the index, 10 s
from the directory; the Edge's 43 s, 21.5 s; the download 12 s (docs/testing.md)."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = "[edge,postgres]"  # the union of what the documented installs ask for
DOWNLOAD_TIMEOUT_S = 600


def package_index() -> dict[str, str]:
    """The environment that points a machine's pip at the wheel directory, made by the
    first test that asks (the test processes share it under a lock)."""
    directory = wheelhouse()
    with open(directory.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / ".complete").exists():
            download(directory)
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(directory)}


def wheelhouse() -> Path:
    """The directory, named by what decides its content: the project's dependencies and
    build requirements, and the Python that installs them."""
    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + sys.version.encode())
    return Path(tempfile.gettempdir()) / f"iop-test-wheelhouse-{key.hexdigest()[:16]}"


def download(directory: Path) -> None:
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    shutil.rmtree(directory, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(directory)]
    done = subprocess.run(
        [*command, f"{ROOT}{EXTRAS}", *build],
        capture_output=True,
        text=True,
        timeout=DOWNLOAD_TIMEOUT_S,
    )
    assert done.returncode == 0, f"pip download: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    (directory / ".complete").touch()


if __name__ == "__main__":  # `make test` starts it beside the checks, on the core they leave
    package_index()
