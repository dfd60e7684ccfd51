"""``Cluster``: N Edges (runedge) on one PostgreSQL database and one config document, M Nodes
(iop-node) and fake upstreams, all on loopback (R-SCALE-2, docs/scale-out.md).

Each Edge gets its own id and ports through the ``runedge`` flags; every Node lists every
Edge (``edge_urls``), starting at a different one so the Nodes spread. With a Redis URL the
Edges run in scale-out mode under one random key prefix; without one each Edge runs its own
in-memory pool (enough to show Nodes moving between Edges and revisions in one database).
``scripts/scale_local.py`` runs the same code for operators.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.support.processes import ROOT, Proc, child_env, free_port, stop_all
from tests.support.stack import START_TIMEOUT_S, Stack

DATABASE_PREFIX = "iop_scale_edges"  # this branch's own databases (one per cluster)


DATABASE = os.environ.get("IOP_TEST_DATABASE_URL", "")
needs_postgres = pytest.mark.skipif(
    not DATABASE.startswith(("postgres://", "postgresql://")),
    reason="needs PostgreSQL: set IOP_TEST_DATABASE_URL=postgresql://... (Edges share it)",
)


def scale_out_redis_url() -> str | None:
    """``IOP_TEST_REDIS_URL`` (scale-out tests run on it), else None."""
    return os.environ.get("IOP_TEST_REDIS_URL") or None


def postgres_test_url() -> str:
    """``IOP_TEST_DATABASE_URL`` (the PostgreSQL server the Edges share), else ''."""
    import os

    return os.environ.get("IOP_TEST_DATABASE_URL", "")


def scale_out_marks() -> list[Any]:
    """The marks of an end-to-end scale-out test: slow, and skipped with the reason unless
    PostgreSQL and Redis are named (``IOP_TEST_DATABASE_URL``, ``IOP_TEST_REDIS_URL``)."""
    import pytest

    return [
        pytest.mark.slow,
        pytest.mark.skipif(
            not postgres_test_url().startswith(("postgres://", "postgresql://")),
            reason="needs PostgreSQL: set IOP_TEST_DATABASE_URL=postgresql://... (Edges share it)",
        ),
        pytest.mark.skipif(
            scale_out_redis_url() is None, reason="scale-out needs Redis: set IOP_TEST_REDIS_URL"
        ),
    ]


def with_database(url: str, name: str) -> str:
    """``url`` (postgresql://...) naming database ``name`` instead."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, ""))


def _admin_statement(server_url: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(with_database(server_url, "postgres"), autocommit=True) as db:
        db.execute(statement)  # type: ignore[arg-type]


@functools.cache
def migrated_postgres_template(server_url: str, prefix: str) -> str:
    """A database on ``server_url`` migrated once per process (``manage.py migrate`` of this
    checkout) for clusters to copy; dropped when the process exits. Its name is this
    process's own (random), so test workers and other checkouts on the server never share
    or drop one another's."""
    name = f"{prefix}_template_{secrets.token_hex(4)}"
    var = tempfile.mkdtemp(prefix="iop-pg-template-")
    atexit.register(shutil.rmtree, var, True)
    _admin_statement(server_url, f'CREATE DATABASE "{name}"')
    atexit.register(_admin_statement, server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0", "--skip-checks"],
        cwd=ROOT,
        env=child_env({"DATABASE_URL": with_database(server_url, name), "IOP_VAR_DIR": var}),
        check=True,
        capture_output=True,
        timeout=180,
    )
    return name


class EdgeHandle:
    """One Edge of a cluster: its id, ports and process."""

    def __init__(self, index: int, node_tls: bool = False, api_tls: bool = False) -> None:
        self.index = index
        self.node_tls, self.api_tls = node_tls, api_tls  # edge.tls (wss://), openai.tls
        self.edge_id = f"edge-{index}"
        self.ports = {"edge": free_port(), "admin": free_port(), "openai": free_port()}
        self.proc: Proc | None = None
        self.since = 0  # where this start's lines begin in its log
        self.root = ROOT  # the checkout it runs (an earlier commit's: R-HA-4 tests)

    @property
    def node_url(self) -> str:
        return f"{'wss' if self.node_tls else 'ws'}://127.0.0.1:{self.ports['edge']}/ws/node"

    @property
    def openai_url(self) -> str:
        return f"{'https' if self.api_tls else 'http'}://127.0.0.1:{self.ports['openai']}"

    @property
    def control_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['admin']}"

    def flags(self) -> list[str]:
        return [
            "--edge-id",
            self.edge_id,
            *("--edge-listen", f"127.0.0.1:{self.ports['edge']}"),
            *("--openai-listen", f"127.0.0.1:{self.ports['openai']}"),
            *("--admin-listen", f"127.0.0.1:{self.ports['admin']}"),
        ]

    def pool_snapshot(self) -> dict[str, Any]:
        import json

        with urllib.request.urlopen(self.control_url + "/pool", timeout=5) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()


class Cluster(Stack):
    """A ``Stack`` with N Edges on one PostgreSQL database; ``stack.edge`` is Edge 0."""

    def __init__(
        self,
        directory: Path,
        *,
        database_url: str,
        edges: int = 2,
        redis_url: str | None = None,
        database_prefix: str = DATABASE_PREFIX,
        lease_ttl_s: float = 2.0,
        revision_poll_s: float = 0.2,
        **kwargs: Any,
    ) -> None:
        super().__init__(directory, **kwargs)
        self.server_url = database_url
        self._database_prefix = database_prefix
        self.database = f"{database_prefix}_{secrets.token_hex(4)}"
        self.database_url = with_database(database_url, self.database)
        self.redis_url = redis_url
        self.redis_prefix = f"iop-se-{secrets.token_hex(4)}"
        # Short so a test sees a dead Edge's leases go, and a fresh key prefix (a new epoch
        # that refuses admissions for one TTL, docs/scale-out.md) admit, soon.
        self.lease_ttl_s = lease_ttl_s
        self.revision_poll_s = revision_poll_s
        tls = (bool(self._edge.get("tls")), bool(self._openai.get("tls")))
        self.edges = [EdgeHandle(i, *tls) for i in range(edges)]
        self.ports = self.edges[0].ports  # the config document names Edge 0's ports
        self._created = False

    # --- the shared database and Redis prefix --------------------------------------------------

    def _admin(self, statement: str) -> None:
        _admin_statement(self.server_url, statement)

    def _create_database(self) -> None:
        """A copy of this process's migrated template (PostgreSQL copies its files: a third of
        a second, where ``migrate`` takes seconds of CPU on each cluster)."""
        template = migrated_postgres_template(self.server_url, self._database_prefix)
        self._admin(f'CREATE DATABASE "{self.database}" TEMPLATE "{template}"')
        self._created = True

    def _drop_database(self) -> None:
        if self._created:
            self._created = False
            self._admin(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')

    def _drop_redis_keys(self) -> None:
        if self.redis_url is None:
            return
        from pool.engine_redis.connect import parse

        client = parse(self.redis_url).sync_client()  # a plain server or Sentinel's primary
        try:  # only this cluster's own prefix, never the whole database
            keys = list(client.scan_iter(match=f"{self.redis_prefix}:*", count=1000))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])
        finally:
            client.close()

    # --- processes -----------------------------------------------------------------------------

    def _edge_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        scale = (
            {
                "IOP_REDIS_URL": self.redis_url,
                "IOP_REDIS_PREFIX": self.redis_prefix,
                "IOP_LEASE_TTL_S": str(self.lease_ttl_s),
                "IOP_REVISION_POLL_S": str(self.revision_poll_s),
            }
            if self.redis_url
            else {}
        )
        return child_env(
            {
                "DATABASE_URL": self.database_url,
                "IOP_VAR_DIR": str(self.dir / "var"),
                "LOG_LEVEL": self._log_level,
                **scale,
                **self._env,
                **(extra or {}),
            }
        )

    def _start_edge(self) -> None:
        self._create_database()
        for handle in self.edges:  # all at once: the first start creates the revision
            self.start_edge(handle.index, wait=False)
        for handle in self.edges:
            self.wait_ready(handle.index)
        self.edge = self.edges[0].proc

    def start_edge(self, index: int, *, wait: bool = True) -> None:
        """(Re)start Edge ``index`` with the cluster's config document."""
        handle = self.edges[index]
        log = self.dir / f"{handle.edge_id}.log"
        handle.since = len(log.read_text(errors="replace")) if log.exists() else 0
        handle.proc = Proc(
            handle.edge_id,
            [
                sys.executable,
                "manage.py",
                "runedge",
                "--config",
                str(self.config_path),
                *handle.flags(),
            ],
            self._edge_env({"PYTHONPATH": str(handle.root)}),
            log,
            cwd=handle.root,
        )
        handle.proc.start()
        if wait:
            self.wait_ready(index)

    def wait_ready(self, index: int) -> None:
        """Until Edge ``index`` printed its ready line since it was last started."""
        handle = self.edges[index]
        assert handle.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while "IOP Edge ready" not in handle.proc.log.read_text(errors="replace")[handle.since :]:
            if not handle.proc.alive():
                raise RuntimeError(f"{handle.edge_id} exited at start:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{handle.edge_id} did not start:\n{self.logs()}")
            time.sleep(0.05)

    def wait_online(self, timeout: float = START_TIMEOUT_S) -> None:
        """Every provider of every running Node is online on some running Edge."""
        running = {
            spec["id"]
            for spec, proc in zip(self._nodes_spec, self.nodes, strict=False)
            if proc.alive()
        }
        deadline = time.monotonic() + timeout
        while True:
            online, offline = set(), set()
            for handle in self.edges:
                if not handle.alive():
                    continue
                for row in handle.pool_snapshot()["providers"]:
                    if row["node_id"] in running:
                        (online if row["online"] else offline).add(row["provider_id"])
            if online and not offline - online:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"providers not online: {offline - online}\n{self.logs()}")
            time.sleep(0.05)

    def edge_of(self, node_id: str) -> int | None:
        """The index of the Edge ``node_id`` is connected to (ready on) by its own log, or
        None while it is not ready anywhere. (In scale-out every Edge shows every Node.)"""
        k = [spec["id"] for spec in self._nodes_spec].index(node_id)
        proc = self.nodes[k]
        if not proc.alive():
            return None
        dialled: int | None = None
        ready_on: int | None = None
        by_port = {h.ports["edge"]: h.index for h in self.edges}
        for line in proc.log.read_text(errors="replace").splitlines():
            dialling = re.search(r"connecting to wss?://127\.0\.0\.1:(\d+)/", line)
            if dialling is not None:
                dialled, ready_on = by_port.get(int(dialling.group(1))), None
            elif " ready: generation " in line:
                ready_on = dialled
            elif "connection lost" in line or "closed the connection" in line:
                ready_on = None
        if ready_on is not None and not self.edges[ready_on].alive():
            return None
        return ready_on

    def chat(self, index: int, model: str = "gpt-test") -> tuple[int, dict[str, Any]]:
        """A chat completion through Edge ``index``: (status, body). While a fresh shared
        pool is still recovering (503 ``pool_recovering``, one lease TTL) it asks again."""
        import json
        import urllib.error

        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            request = urllib.request.Request(
                self.edges[index].openai_url + "/v1/chat/completions",
                data=json.dumps(body).encode(),
                headers={
                    "Authorization": f"Bearer {self.token}",
                    "Content-Type": "application/json",
                },
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as exc:
                answer = json.loads(exc.read())
                recovering = answer.get("error", {}).get("code") == "pool_recovering"
                if not recovering or time.monotonic() > deadline:
                    return exc.code, answer
            time.sleep(0.1)

    def kill_edge(self, index: int, sig: int = 9) -> None:
        """Stop Edge ``index`` (SIGKILL by default: a crash, nothing drained)."""
        proc = self.edges[index].proc
        if proc is not None:
            proc.stop(sig)

    def _node_proc(self, node_id: str, extra: dict[str, Any]) -> Proc:
        """Every Node lists every Edge, the k-th Node starting at Edge k mod N."""
        k = [spec["id"] for spec in self._nodes_spec].index(node_id)
        urls = [h.node_url for h in self.edges]
        urls = urls[k % len(urls) :] + urls[: k % len(urls)]
        return super()._node_proc(node_id, {"edge_url": None, "edge_urls": urls, **extra})

    def stop(self) -> None:
        stop_all(self.nodes)  # the Nodes first, together; then the Edges, together
        stop_all([handle.proc for handle in self.edges if handle.proc is not None])
        for upstream in self.upstreams.values():
            upstream.stop()
        if self._created:  # once: a second stop (atexit) may find the Redis gone
            self._drop_redis_keys()
        self._drop_database()

    def logs(self) -> str:
        parts = []
        for proc in [*(h.proc for h in self.edges), *self.nodes]:
            if proc is not None and proc.log.exists():
                parts.append(f"--- {proc.name} ---\n{proc.log.read_text(errors='replace')}")
        return "\n".join(parts)

    def remove(self) -> None:
        """Delete the cluster's directory (logs, configs)."""
        shutil.rmtree(self.dir, ignore_errors=True)
