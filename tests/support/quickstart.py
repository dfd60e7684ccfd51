"""``make_run``: the README's ``make run`` (or a page's variant of it) in a copy of the
checkout's tracked files, on free ports, until it prints the client token; stopped with
Ctrl-C (SIGINT to its process group) at the end. The copy gets this checkout's ``.venv``
(the install ``make run`` would do) and the ports 7700, 7701 and 8080 of its
``configs/edge.yaml`` and ``scripts/run_local.py`` become free ports."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from catalog.config.rules.example_tokens import ALLOW_ENV
from tests.support import free_port
from tests.support.journeys import (
    EXAMPLE_PORTS,
    link_project_venv,
    run_script,
    source_checkout,
    with_ports,
)
from tests.support.processes import child_env, sigint_ignored

# The first run migrates and imports the catalog: about 20 s on an idle machine, 90 on a busy one.
START_TIMEOUT_S = 240.0
TOKEN_LINE = re.compile(r"^Client token \(keep it private\): (\S+)$", re.MULTILINE)


@dataclass
class Quickstart:
    """A running ``make run``: its checkout, environment, ports and what it printed."""

    work: Path
    env: dict[str, str]
    ports: dict[str, int]  # by role, as tests.support.journeys.EXAMPLE_PORTS
    output: list[str]
    token: str
    pid: int  # the shell running the command (its process group's leader)

    def substitute(self, text: str) -> str:
        return with_ports(text, self.ports)

    def log(self) -> str:
        return "".join(self.output)

    def run(self, block: str) -> str:
        """A page's block in the checkout, with ``TOKEN`` set; its stdout."""
        return run_script(self.substitute(block), self.work, {**self.env, "TOKEN": self.token})

    def provider_online(self, provider_id: str) -> bool:
        url = f"http://127.0.0.1:{self.ports['admin']}/pool"
        with urllib.request.urlopen(url, timeout=5) as resp:
            rows = json.loads(resp.read())["providers"]
        return any(row["provider_id"] == provider_id and row["online"] for row in rows)


@contextlib.contextmanager
def make_run(
    directory: Path, command: str, env: dict[str, str] | None = None
) -> Iterator[Quickstart]:
    """Run ``command`` (one line of a page, ``make run`` in it) in a fresh copy of the checkout."""
    work = source_checkout(directory)
    link_project_venv(work)
    ports = {role: free_port() for role in EXAMPLE_PORTS}
    for name in ("configs/edge.yaml", "scripts/run_local.py"):
        path = work / name
        path.write_text(with_ports(path.read_text(), ports))
    environ = child_env({"PYTHONPATH": str(work), **(env or {})})
    for name in ("DATABASE_URL", "IOP_VAR_DIR", ALLOW_ENV, "IOP_REDIS_URL"):
        environ.pop(name, None)  # a newcomer's machine: the embedded default
    with sigint_ignored():  # Ctrl-C must stop it all the same (below)
        proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=work,
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    output: list[str] = []
    printed = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            if TOKEN_LINE.search(line):
                printed.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not printed.wait(0.2):
            if proc.poll() is not None or time.monotonic() > deadline:
                reader.join(timeout=10)
                raise AssertionError(f"{command} printed no client token:\n{''.join(output)}")
        found = TOKEN_LINE.search("".join(output))
        assert found is not None
        yield Quickstart(work, environ, ports, output, found.group(1), proc.pid)
    finally:
        _signal(proc.pid, signal.SIGINT)  # Ctrl-C, as the reader stops it
        try:
            proc.wait(timeout=60)
            hung = False
        except subprocess.TimeoutExpired:
            _signal(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            hung = True
        reader.join(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert not hung, f"{command} did not stop on Ctrl-C within 60 s:\n{''.join(output)[-4000:]}"


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def command_of(block: str) -> str:
    """The one command line of a block, without its comment."""
    (line,) = [ln.split("#")[0].strip() for ln in block.splitlines() if ln.split("#")[0].strip()]
    return line
