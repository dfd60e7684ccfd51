"""Run a docs page's tagged blocks as written, each on the "machine" it is for.

A page tags its blocks with the page's tag: ```` ```sh TAG=NAME ```` is a command block and
```` ```yaml TAG=FILE ```` a file the reader writes (``FILE``, relative to the checkout).
A ``Machine`` is a directory standing for one computer: ``root`` plays ``/`` for the page's
``/etc/iop`` paths, ``checkout`` is a fresh copy of the project (``source_checkout``), and
commands run there with a clean environment (no Django settings, no database URL, no test
variables). The only changes made to a block's text are ``DocPage.substitutions`` (host
names and ports the test maps to loopback and free ports), ``/etc/iop`` moved under the
machine's root, and ``<placeholders>`` filled with what an earlier command printed, as the
reader pastes it. Each test says which it uses in its docstring.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from tests.support.journeys import (
    COMMAND_TIMEOUT_S,
    doc_blocks,
    link_project_venv,
    source_checkout,
)
from tests.support.processes import Proc

# The Edge's own install line, as the Makefile's `make .venv/.installed-base` runs it.
EDGE_INSTALL = ["python3 -m venv .venv", ".venv/bin/pip install -e '.[edge]'"]
PLACEHOLDER = re.compile(r"<[^<>\n]+>")
ETC = "/etc/iop"


class Machine:
    """One computer of a page: a fresh checkout, its own ``/etc/iop``, its own environment."""

    def __init__(self, name: str, directory: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.root = directory / f"{name}-root"
        self.checkout = directory / f"{name}-checkout"
        self.root.mkdir(parents=True)
        self.checkout.mkdir(parents=True)
        source_checkout(self.checkout)
        drop = ("DJANGO_", "PYTEST_", "IOP_", "DATABASE_URL", "VIRTUAL_ENV", "PYTHONPATH")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        self.env.update({"PYTHONUNBUFFERED": "1", **(env or {})})
        self.procs: list[Proc] = []

    @property
    def etc(self) -> Path:
        """This machine's ``/etc/iop``."""
        return self.root / ETC.lstrip("/")

    def link_project_venv(self) -> None:
        """The Edge install without running pip: the project's own ``.venv`` was made by the
        same ``pip install -e '.[edge]'`` (``make``), so it stands for the page's install."""
        link_project_venv(self.checkout)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


class DocPage:
    """The tagged blocks of one page and how to run them on a ``Machine``."""

    def __init__(self, page: Path, tag: str, substitutions: dict[str, str]) -> None:
        self.page = page
        self.tag = tag
        self.commands = doc_blocks(page, tag, "sh")
        self.files = doc_blocks(page, tag, "yaml")
        self.substitutions = substitutions
        self.filled: dict[str, str] = {}

    def text(self, body: str, machine: Machine) -> str:
        """``body`` as this machine runs it (see the module docstring)."""
        for old, new in self.substitutions.items():
            body = body.replace(old, new)
        body = body.replace(ETC, str(machine.etc))

        def fill(match: re.Match[str]) -> str:
            if match.group(0) not in self.filled:
                raise AssertionError(f"{self.page.name}: nothing fills {match.group(0)}")
            return self.filled[match.group(0)]

        return PLACEHOLDER.sub(fill, body)

    def run(self, name: str, machine: Machine, *, skip_lines: int = 0) -> str:
        """Run block ``name`` (without its first ``skip_lines`` lines) on ``machine``; its
        stdout; AssertionError with the output when it fails."""
        body = "\n".join(self.commands[name].strip().splitlines()[skip_lines:])
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", self.text(body, machine)],
            cwd=machine.checkout,
            env=machine.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S * 5,
        )
        if done.returncode != 0:
            raise AssertionError(
                f"{self.page.name} {name}: exit {done.returncode}\n--- stdout\n{done.stdout}"
                f"\n--- stderr\n{done.stderr}"
            )
        return done.stdout

    def install_edge(self, name: str, machine: Machine) -> str:
        """The page's Edge install block: its install lines must be the Makefile's (then the
        project's ``.venv`` stands for them); every later line runs as written."""
        lines = self.commands[name].strip().splitlines()
        assert lines[: len(EDGE_INSTALL)] == EDGE_INSTALL, lines
        machine.link_project_venv()
        return self.run(name, machine, skip_lines=len(EDGE_INSTALL))

    def write(self, name: str, machine: Machine) -> Path:
        """The page's file ``name`` written into the machine's checkout, as the reader would."""
        path = machine.checkout / name
        path.write_text(self.text(self.files[name], machine))
        return path

    def start(self, name: str, machine: Machine, log_dir: Path) -> Proc:
        """Block ``name``: every line but the last runs to its end; the last one is a
        service (an Edge, a Node), left running with its output in ``log_dir``."""
        lines = self.commands[name].strip().splitlines()
        if len(lines) > 1:
            self.commands[f"{name}:before"] = "\n".join(lines[:-1])
            self.run(f"{name}:before", machine)
        # bash runs a lone simple command in its own process (no fork), so signals reach it
        argv = ["bash", "-c", self.text(lines[-1], machine)]
        log = log_dir / f"{machine.name}-{name}.log"
        proc = Proc(f"{machine.name}-{name}", argv, machine.env, log, machine.checkout)
        proc.start()
        machine.procs.append(proc)
        return proc


def copy(source: Path, target_dir: Path, name: str | None = None, mode: int = 0o644) -> Path:
    """One file carried to the other machine (the page's "copy to the Node machine")."""
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / (name or source.name)
    shutil.copyfile(source, target)
    target.chmod(mode)
    return target
