"""Run the command blocks of docs/journeys.md as written, against an Edge set up as `make run`.

A block is a fenced ``sh journey=NAME`` block. The only changes made to its text: the example
ports (7700, 7701, 8080) become this Edge's free ports and ``wss://EDGE_HOST`` becomes
``ws://127.0.0.1`` (both Nodes run on this machine; TLS is tested on its own).
Edge-side commands run in a working directory where ``.venv`` and ``manage.py`` are the
project's, with the database and ``var/`` of this Edge only.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from catalog.config.rules.example_tokens import ALLOW_ENV as ALLOW_EXAMPLE_HASHES
from tests.support.ports import free_port
from tests.support.processes import EDGE_YAML, ROOT, Proc, child_env, migrated_template

JOURNEYS_MD = ROOT / "docs" / "journeys.md"
EXAMPLE_PORTS = {"edge": 7700, "admin": 7701, "openai": 8080}

COMMAND_TIMEOUT_S = 120.0
ADMIN_USER = ("--username", "admin", "--email", "admin@localhost")
START_TIMEOUT_S = 30.0


def doc_blocks(path: Path, tag: str, lang: str = "sh") -> dict[str, str]:
    """Every ```` ```LANG TAG=NAME ```` block of a page, by name (docs/journeys.md uses
    ``journey``; other pages their own tag, run by ``tests.support.doc_pages``)."""
    block = re.compile(
        rf"^[ \t]*```{re.escape(lang)} {re.escape(tag)}=([\w.-]+)\n(.*?)^[ \t]*```$",
        re.MULTILINE | re.DOTALL,
    )
    return {name: _dedent(body) for name, body in block.findall(path.read_text())}


def _dedent(body: str) -> str:
    """A block indented under a list item, as the reader copies it."""
    return textwrap.dedent(body)


def journey_blocks(path: Path = JOURNEYS_MD) -> dict[str, str]:
    """Every ``sh journey=NAME`` block of the page, by name."""
    return doc_blocks(path, "journey")


def source_checkout(target: Path) -> Path:
    """A copy of the tracked files of this checkout (what a fresh clone holds)."""
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / name.decode()
        if source.is_file():
            (target / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name.decode())
    return target


def link_project_venv(checkout: Path) -> None:
    """The project's own ``.venv`` as ``checkout``'s install (made by the same ``make``). The
    copy's ``pyproject.toml`` is dated before that install's stamp, so a ``make`` in the copy
    never installs again into the shared ``.venv`` (which would point the project's editable
    install at the copy, gone after the test)."""
    (checkout / ".venv").symlink_to(ROOT / ".venv")
    stamp, project = ROOT / ".venv" / ".installed-base", checkout / "pyproject.toml"
    if stamp.exists() and project.exists():
        before = stamp.stat().st_mtime - 1
        os.utime(project, (before, before))


class JourneyEdge:
    """An Edge started the way `make run` starts it (catalog imported once, tokens minted into
    the catalog, ``runedge`` without ``--config``), its local Node, and the commands of the
    journeys run in its working directory."""

    def __init__(
        self,
        directory: Path,
        extra_providers: list[dict[str, Any]],
        extra_models: list[dict[str, Any]],
    ) -> None:
        self.dir = directory
        self.work = directory / "edge-checkout"
        self.work.mkdir(parents=True)
        link_project_venv(self.work)
        (self.work / "manage.py").symlink_to(ROOT / "manage.py")
        (self.work / "var").mkdir()
        self.ports = {role: free_port() for role in EXAMPLE_PORTS}
        self.db = directory / "edge.sqlite3"
        shutil.copyfile(migrated_template(), self.db)
        self.env = child_env(
            {"DATABASE_URL": f"sqlite:///{self.db}", "IOP_VAR_DIR": str(self.work / "var")}
        )
        self.env.pop(ALLOW_EXAMPLE_HASHES, None)  # an operator's Edge, not the test suite's
        self.config = directory / "edge.yaml"
        self.config.write_text(self._example(extra_providers, extra_models))
        self.tokens: dict[str, str] = {}
        self.edge: Proc | None = None
        self.local_node: Proc | None = None
        self.procs: list[Proc] = []

    # --- the documented commands -------------------------------------------------------------

    def substitute(self, text: str) -> str:
        text = with_ports(text, self.ports)
        return text.replace("wss://EDGE_HOST", "ws://127.0.0.1")  # loopback, no TLS

    def run(self, script: str, cwd: Path | None = None) -> str:
        """Run shell text with this Edge's environment; its stdout; fail with its output."""
        return run_script(self.substitute(script), cwd or self.work, self.env)

    def json_lines(self, output: str) -> list[dict[str, Any]]:
        """The JSON reports printed by the block's curl commands, in order."""
        return printed_json(output)

    def service(self, name: str, command: str, cwd: Path, env: dict[str, str]) -> Proc:
        """Start one long-running command line of a block (a Node) as a child process."""
        argv = ["bash", "-c", "exec " + self.substitute(command)]
        proc = Proc(name, argv, env, self.dir / f"{name}.log", cwd)
        proc.start()
        self.procs.append(proc)
        return proc

    # --- the Edge as `make run` runs it --------------------------------------------------------

    def first_run(self) -> dict[str, str]:
        """What `make run` does once: mint tokens, import the example with their hashes in
        place of its example ones, create the admin login; and what it does on each start:
        write the local Node's config with the policy `iop_node_policy` prints for it."""
        manage = ".venv/bin/python manage.py "
        node = json.loads(self.run(manage + "iop_token --json"))
        client = json.loads(self.run(manage + "iop_token --json"))
        document = yaml.safe_load(self.config.read_text())
        document["nodes"][0]["token_hash_sha256"] = node["sha256"]
        for entry in document["openai"]["principal_tokens"]:
            entry["token_hash_sha256"] = client["sha256"]
            break
        document["openai"]["principal_tokens"] = document["openai"]["principal_tokens"][:1]
        self.config.write_text(yaml.safe_dump(document, sort_keys=False))
        self.run(manage + f"iop_config import --if-empty {self.config}")
        (self.work / "var" / "node-token").write_text(node["token"])
        (self.work / "var" / "node.yaml").write_text(
            "node_id: node-local\n"
            f"edge_url: ws://127.0.0.1:{self.ports['edge']}/ws/node\n"
            "token: {file: node-token}\n" + self.run(manage + "iop_node_policy node-local")
        )
        password = secrets.token_urlsafe(12)
        subprocess.run(
            [
                sys.executable,
                "manage.py",
                "createsuperuser",
                "--noinput",
                "--skip-checks",  # they look at code: `manage.py check` (make test)
                "--username",
                "admin",
                "--email",
                "admin@localhost",
            ],
            cwd=self.work,
            env={**self.env, "DJANGO_SUPERUSER_PASSWORD": password},
            check=True,
            capture_output=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        return {"node": node["token"], "client": client["token"], "admin": password}

    def start(self) -> None:
        """Start ``runedge`` and wait for its ready line (the log is appended across starts)."""
        seen = len(self.edge_log())
        self.edge = Proc(
            "edge",
            [sys.executable, "manage.py", "runedge"],
            self.env,
            self.dir / "edge.log",
            self.work,
        )
        self.edge.start()
        wait_for(
            lambda: "IOP Edge ready" in self.edge_log()[seen:],
            START_TIMEOUT_S,
            "the Edge ready",
            check=lambda: self.edge is not None and self.edge.alive(),
            log=self.edge_log,
        )

    def start_local_node(self) -> None:
        argv = [sys.executable, "-m", "nodes.agent.main", "--config", "var/node.yaml"]
        self.local_node = Proc("node-local", argv, self.env, self.dir / "node-local.log", self.work)
        self.local_node.start()
        self.procs.append(self.local_node)

    def stop_edge(self) -> int:
        """SIGTERM (the drain), wait for the exit; the exit status."""
        assert self.edge is not None and self.edge.popen is not None
        popen = self.edge.popen
        self.edge.stop()
        return int(popen.returncode)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        if self.edge is not None:
            self.edge.stop()

    def edge_log(self) -> str:
        path = self.dir / "edge.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # --- observation ---------------------------------------------------------------------------

    def pool(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.ports['admin']}/pool"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]

    def provider(self, provider_id: str) -> dict[str, Any] | None:
        rows = [p for p in self.pool()["providers"] if p["provider_id"] == provider_id]
        return rows[0] if rows else None

    def wait_provider(self, provider_id: str, done: Callable[[dict[str, Any] | None], bool],
                      what: str) -> None:  # fmt: skip
        wait_for(lambda: done(self.provider(provider_id)), START_TIMEOUT_S, what, log=self.logs)

    def logs(self) -> str:
        parts = [f"--- edge ---\n{self.edge_log()}"]
        for proc in self.procs:
            if proc.log.exists():
                parts.append(f"--- {proc.name} ---\n{proc.log.read_text(errors='replace')}")
        return "\n".join(parts)[-8000:]

    def _example(
        self, extra_providers: list[dict[str, Any]], extra_models: list[dict[str, Any]]
    ) -> str:
        """configs/edge.yaml on this Edge's ports, plus the test's own providers on node-local."""
        document = yaml.safe_load(self.substitute(EDGE_YAML.read_text()))
        document["edge"]["bootstrap_dir"] = str(self.dir / "bootstrap")
        document["nodes"][0]["providers"].extend(extra_providers)
        document["models"].extend(extra_models)
        return yaml.safe_dump(document, sort_keys=False)


def with_ports(text: str, ports: dict[str, int]) -> str:
    """``text`` with the example's listen ports (``EXAMPLE_PORTS``) replaced by ``ports``."""
    for role, port in EXAMPLE_PORTS.items():
        text = text.replace(f":{port}", f":{ports[role]}")
    return text


def run_script(script: str, cwd: Path, env: dict[str, str]) -> str:
    """Run a page's shell text as written (``bash -e -o pipefail``); its stdout, or an
    AssertionError with its output."""
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"exit {done.returncode}:\n{script}\n--- stdout\n{done.stdout}\n"
            f"--- stderr\n{done.stderr}"
        )
    return done.stdout


def printed_json(output: str) -> list[Any]:
    """The JSON documents a command printed (curl's answers), in order."""
    decoder = json.JSONDecoder()
    found, index = [], output.find("{")
    while index != -1:
        value, end = decoder.raw_decode(output, index)
        found.append(value)
        index = output.find("{", end)
    return found


def wait_for(
    done: Callable[[], bool],
    timeout: float,
    what: str,
    *,
    check: Callable[[], bool] | None = None,
    log: Callable[[], str] | None = None,
) -> None:
    """Poll ``done`` until it holds; AssertionError after ``timeout`` or when ``check`` fails."""
    deadline = time.monotonic() + timeout
    while not done():
        if check is not None and not check():
            raise AssertionError(f"{what}: the process exited\n{log() if log else ''}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s\n{log() if log else ''}")
        time.sleep(0.05)
