"""The checks `make test` runs before any test (docs/testing.md), in lanes side by side:
mypy, the longest, in one; the others in turn in another; and the coding agents' CLIs
installed in a third (scripts/install-clients.sh, which may fail: the tests that need them
skip, and `make test`'s last line says why). Each command's output is printed whole when it
ends, under its command line; the exit status is 1 when a check failed.

    .venv/bin/python scripts/checks.py
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".venv" / "bin"
PY = str(BIN / "python")

LANES: list[list[list[str]]] = [
    [[str(BIN / "mypy")]],
    [
        [PY, "manage.py", "check"],
        [PY, "manage.py", "makemigrations", "--check", "--dry-run"],
        [str(BIN / "ruff"), "check", "."],
        [str(BIN / "lint-imports")],
    ],
]
OPTIONAL = ["bash", "scripts/install-clients.sh"]  # may fail: see the docstring
TIMEOUT_S = 900  # a fresh mypy cache and a first npm install stay far below this


def _shown(argv: list[str]) -> str:
    return " ".join(
        Path(a).relative_to(ROOT).as_posix() if a.startswith(str(ROOT)) else a for a in argv
    )


class Runner:
    """Runs lanes of commands, one lane per thread, printing each command's output whole."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self._print = threading.Lock()

    def run(self, argv: list[str], *, required: bool = True) -> bool:
        try:
            done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
            output, ok = done.stdout + done.stderr, done.returncode == 0
        except subprocess.TimeoutExpired:
            output, ok = f"did not end within {TIMEOUT_S} s\n", False
        with self._print:
            print(_shown(argv), flush=True)
            (sys.stdout if ok else sys.stderr).write(output)
            sys.stdout.flush()
            if required and not ok:
                self.failed.append(_shown(argv))
        return ok

    def lane(self, commands: list[list[str]]) -> None:
        for argv in commands:
            if not self.run(argv):
                return  # the rest of a lane waits for the fix


def main() -> int:
    runner = Runner()
    threads = [threading.Thread(target=runner.lane, args=(lane,)) for lane in LANES]
    threads.append(
        threading.Thread(target=runner.run, args=(OPTIONAL,), kwargs={"required": False})
    )
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if runner.failed:
        print(f"failed: {', '.join(runner.failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
