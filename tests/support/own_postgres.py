"""A PostgreSQL cluster of the test's own (R-HA-3): ``initdb`` and ``pg_ctl`` from the local
PostgreSQL install, on a free loopback port, trust authentication, so a test may stop it
under load and start it again. Run as the ``postgres`` user when the tests run as root
(``initdb`` refuses root)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.processes import free_port

BIN = sorted(glob.glob("/usr/lib/postgresql/*/bin"))


def available() -> bool:
    return bool(BIN) and (os.geteuid() != 0 or shutil.which("runuser") is not None)


class OwnPostgres:
    """``start()``, ``stop()``; ``url(database)`` names one of its databases."""

    def __init__(self) -> None:
        self.port = free_port()
        # Its own directory under /tmp: pytest's are private to the user running the tests.
        self.directory = Path(tempfile.mkdtemp(prefix="iop-postgres-"))
        self.data = self.directory / "data"
        self.socket_dir = self.directory / "sock"

    def _run(self, tool: str, *args: str) -> None:
        argv = [str(Path(BIN[-1]) / tool), *args]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stdout[-1000:]}{done.stderr[-1000:]}")

    def init(self) -> None:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres")
            shutil.chown(self.socket_dir, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def start(self) -> None:
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.socket_dir} "
                   "-c fsync=off -c full_page_writes=off")  # fmt: skip
        log = str(self.directory / "postgres.log")
        self._run("pg_ctl", "-D", str(self.data), "-l", log, "-w", "-o", options, "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def query(self, sql: str, database: str = "iop") -> list[tuple[object, ...]]:
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as db:
            cursor = db.execute(sql)  # type: ignore[arg-type]
            return list(cursor.fetchall()) if cursor.description else []
