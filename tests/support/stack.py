"""``Stack``: one Edge (runedge), its Nodes (iop-node) and fake upstreams, all on loopback."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import http.client
import json
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self

import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.support.ports import free_port
from tests.support.processes import ROOT, Proc, child_env, migrated_template, sha256_hex
from tests.support.upstream_loop import FakeUpstream

START_TIMEOUT_S = 30.0
TOKEN_REF = "app-test"
PRINCIPAL_REF = "team-test"


def _substitute(value: Any, urls: dict[str, str], kind: str = "up") -> Any:
    if isinstance(value, str):
        for name, url in urls.items():
            value = value.replace("{" + kind + ":" + name + "}", url)
        return value
    if isinstance(value, list):
        return [_substitute(v, urls, kind) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, urls, kind) for k, v in value.items()}
    return value


def provider_row(snapshot: dict[str, Any], provider_id: str) -> dict[str, Any]:
    """The row of ``provider_id`` in a ``/pool`` snapshot; KeyError if it has none."""
    for row in snapshot["providers"]:
        if row["provider_id"] == provider_id:
            return row  # type: ignore[no-any-return]
    raise KeyError(provider_id)


def messages_profile(upstream: str = "main") -> dict[str, Any]:
    """A custom Anthropic Messages profile on a fake upstream (key in ``x-api-key``)."""
    return {
        "driver": "anthropic_messages",
        "base_url": "{up:" + upstream + "}/v1",
        "operations": {"messages": "/messages", "count_tokens": "/messages/count_tokens"},
        "auth": {"type": "header", "header": "x-api-key", "scheme": ""},
        "capabilities": ["messages", "streaming", "tool_calling", "count_tokens"],
    }


DEFAULT_PROVIDERS = [
    {"id": "p-openai", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 4},
]
DEFAULT_MODELS = [{"id": "gpt-test", "providers": {"p-openai": "served-gpt"}}]


def token_entries(
    tokens: dict[str, tuple[str, dict[str, Any]]], raw: dict[str, str]
) -> list[dict[str, Any]]:
    """``openai.principal_tokens`` entries from ``{name: (principal, policy)}``: token
    ``app-<name>`` of that principal with that policy, hashed from ``raw[name]``."""
    return [
        {
            "token_ref": f"app-{name}",
            "principal_ref": principal,
            "token_hash_sha256": sha256_hex(raw[name]),
            **policy,
        }
        for name, (principal, policy) in tokens.items()
    ]


class Stack:
    """One Edge (runedge subprocess), its Nodes (iop-node subprocesses) and fake upstreams."""

    def __init__(
        self,
        directory: Path,
        *,
        upstreams: dict[str, str] | None = None,
        providers: list[dict[str, Any]] | None = None,
        models: list[dict[str, Any]] | None = None,
        nodes: list[dict[str, Any]] | None = None,
        openai: dict[str, Any] | None = None,
        edge: dict[str, Any] | None = None,
        pool: dict[str, Any] | None = None,
        profiles: dict[str, Any] | None = None,
        credential_plane: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        log_level: str = "INFO",
        admin_token: str | None = None,
        token_policy: dict[str, Any] | None = None,
        tokens: list[dict[str, Any]] | None = None,
        principals: list[dict[str, Any]] | None = None,
        metering: dict[str, Any] | None = None,
        root: Path = ROOT,
        node_root: Path | None = None,
        node_python: str | None = None,
    ) -> None:
        self.dir = Path(directory)
        # The checkout whose Edge and Nodes run (another one: a bench baseline, scripts/bench.py)
        self.root = root
        self.node_root = node_root or root  # the Nodes' checkout (an older one: R-HA-4 tests)
        # the Nodes' interpreter (another Python's virtualenv: a bench variant); default ours
        self.node_python = node_python or sys.executable
        self.dir.mkdir(parents=True, exist_ok=True)
        self._upstream_kinds = upstreams if upstreams is not None else {"main": "openai"}
        self._nodes_spec = nodes or [{"id": "node-1", "providers": providers or DEFAULT_PROVIDERS}]
        self._models = models or DEFAULT_MODELS
        self._openai = openai or {}
        self._edge = edge or {}  # e.g. {"tls": {...}}: Nodes then dial wss://
        self._pool = pool or {}
        self._profiles = profiles or {}
        self._credential_plane = credential_plane  # managed mode (docs/credentials.md)
        self._env = env or {}
        self._token_policy = token_policy or {}  # more keys of the stack's own token (budget)
        self._tokens = tokens or []  # more principal_tokens entries, after the stack's own
        self._principals = principals  # the top-level ``principals:`` list (R-MGD-13)
        self._metering = metering  # the ``metering:`` section (R-COST-1)
        # admin.token (docs/configuration.md): the control helpers below then present it.
        self.admin_token = admin_token
        if admin_token is not None:
            self._env = {**self._env, "IOP_TEST_ADMIN_TOKEN": admin_token}
        self._log_level = log_level
        self.token = "iop-test-" + secrets.token_urlsafe(24)
        self._node_tokens = {n["id"]: "node-" + secrets.token_urlsafe(24) for n in self._nodes_spec}
        self.upstreams: dict[str, FakeUpstream] = {}
        self.edge: Proc | None = None
        self.nodes: list[Proc] = []
        self.ports = {"edge": free_port(), "admin": free_port(), "openai": free_port()}
        self.config_path = self.dir / "edge.yaml"

    # --- addresses ---------------------------------------------------------------------------

    @property
    def openai_url(self) -> str:
        scheme = "https" if self._openai.get("tls") else "http"
        return f"{scheme}://127.0.0.1:{self.ports['openai']}"

    @property
    def node_url(self) -> str:
        scheme = "wss" if self._edge.get("tls") else "ws"
        return f"{scheme}://127.0.0.1:{self.ports['edge']}/ws/node"

    @property
    def v1_url(self) -> str:
        return self.openai_url + "/v1"

    @property
    def control_url(self) -> str:
        """The control listener (``admin.listen``): /pool, /metrics, /refresh."""
        return f"http://127.0.0.1:{self.ports['admin']}"

    def upstream(self, name: str = "main") -> FakeUpstream:
        return self.upstreams[name]

    # --- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, *, wait_online: bool = True) -> Self:
        """Start everything; unless told otherwise, wait until every provider is online."""
        atexit.register(self.stop)  # no child process outlives a crashed test run
        try:
            for name, kind in self._upstream_kinds.items():
                self.upstreams[name] = FakeUpstream(kind)
            self._write_config()
            self._start_edge()
            for spec in self._nodes_spec:
                self.nodes.append(self._node_proc(spec["id"], spec.get("config", {})))
                self.nodes[-1].start()
            if wait_online:
                self.wait_online()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop Nodes, the Edge and the upstreams; safe to call more than once."""
        for node in self.nodes:
            node.stop()
        if self.edge is not None:
            self.edge.stop()
        for upstream in self.upstreams.values():
            upstream.stop()

    def _write_config(self) -> None:
        urls = {name: up.url for name, up in self.upstreams.items()}
        openai = {
            "listen": f"127.0.0.1:{self.ports['openai']}",
            "principal_tokens": [
                {
                    "token_ref": TOKEN_REF,
                    "principal_ref": PRINCIPAL_REF,
                    "token_hash_sha256": sha256_hex(self.token),
                    **self._token_policy,
                },
                *self._tokens,
            ],
            **self._openai,
        }
        doc: dict[str, Any] = {
            "edge": {
                "id": "edge-test",
                "listen": f"127.0.0.1:{self.ports['edge']}",
                "bootstrap_dir": str(self.dir / "bootstrap"),
                **self._edge,
            },
            "admin": {
                "listen": f"127.0.0.1:{self.ports['admin']}",
                **({"token": {"env": "IOP_TEST_ADMIN_TOKEN"}} if self.admin_token else {}),
            },
            "openai": openai,
            "provider_pool": {"max_queue": 16, "queue_timeout_ms": 30000, **self._pool},
            "nodes": [
                {
                    "id": n["id"],
                    "token_hash_sha256": sha256_hex(self._node_tokens[n["id"]]),
                    **({"credential_recipient": n["recipient"]} if "recipient" in n else {}),
                    "providers": _substitute(n["providers"], urls),
                }
                for n in self._nodes_spec
            ],
            "models": self._models,
        }
        if self._profiles:
            doc["protocol_profiles"] = _substitute(self._profiles, urls)
        if self._credential_plane is not None:
            doc["credential_plane"] = self._credential_plane
        if self._principals is not None:
            doc["principals"] = self._principals
        if self._metering is not None:
            doc["metering"] = self._metering
        self.config_path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def _edge_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The Edge's environment: its own database and var dir, plus the stack's ``env``."""
        return child_env(
            {
                "PYTHONPATH": str(self.root),
                "DATABASE_URL": f"sqlite:///{self.dir / 'edge.sqlite3'}",
                "IOP_VAR_DIR": str(self.dir / "var"),
                "LOG_LEVEL": self._log_level,
                **self._env,
                **(extra or {}),
            }
        )

    def manage(self, *args: str, stdin: bytes = b"") -> str:
        """``manage.py ARGS`` against the running Edge's own database; its stdout.
        A failing command raises with its stderr."""
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=self.root,
            env=self._edge_env(),
            input=stdin,
            capture_output=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {args[0]} failed: {done.stderr.decode()[-2000:]}")
        return done.stdout.decode()

    def create_superuser(self, username: str, password: str) -> None:
        """A superuser in the running Edge's own database (``manage.py createsuperuser``)."""
        subprocess.run(
            [
                sys.executable,
                "manage.py",
                "createsuperuser",
                "--noinput",
                "--skip-checks",  # they look at code: `manage.py check` (make test)
                "--username",
                username,
                "--email",
                f"{username}@localhost",
            ],
            cwd=self.root,
            env=self._edge_env({"DJANGO_SUPERUSER_PASSWORD": password}),
            check=True,
            capture_output=True,
            timeout=60,
        )

    def _start_edge(self) -> None:
        shutil.copyfile(migrated_template(self.root), self.dir / "edge.sqlite3")
        env = self._edge_env()
        self.edge = Proc(
            "edge",
            [sys.executable, "manage.py", "runedge", "--config", str(self.config_path)],
            env,
            self.dir / "edge.log",
            cwd=self.root,
        )
        self.edge.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while "IOP Edge ready" not in self.edge.log.read_text(errors="replace"):
            if not self.edge.alive():
                raise RuntimeError(f"the Edge exited at start:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Edge did not start in {START_TIMEOUT_S}s:\n{self.logs()}")
            time.sleep(0.05)

    def _node_proc(self, node_id: str, extra: dict[str, Any]) -> Proc:
        """``extra``: more node.yaml keys (tls, policy, allow_plaintext, edge_url); in them
        ``{up:NAME}`` becomes that upstream's ``http://host:port`` (a policy.hosts entry
        for plain http, R-TLS-3) and ``{host:NAME}`` its bare ``host:port`` (https only)."""
        urls = {name: up.url for name, up in self.upstreams.items()}
        extra = _substitute(extra, urls)
        hostports = {name: url.split("://", 1)[1] for name, url in urls.items()}
        extra = _substitute(extra, hostports, "host")
        path = self.dir / f"{node_id}.yaml"
        doc = {"node_id": node_id, "edge_url": self.node_url, "token": {"env": "IOP_NODE_TOKEN"}}
        path.write_text(yaml.safe_dump({**doc, **extra}))
        token = self._node_tokens[node_id]
        env = child_env({"PYTHONPATH": str(self.node_root), "IOP_NODE_TOKEN": token, **self._env})
        argv = [
            self.node_python,
            "-m",
            "nodes.agent.main",
            "--config",
            str(path),
            "--log-level",
            self._log_level,
            "--shutdown-grace",
            "1",
        ]
        return Proc(node_id, argv, env, self.dir / f"{node_id}.log", cwd=self.node_root)

    def kill_node(self, index: int = 0) -> None:
        """SIGKILL a Node (a crash: no goodbye on the wire)."""
        self.nodes[index].stop(signal.SIGKILL)

    def restart_node(self, index: int = 0) -> None:
        """Start a stopped Node again and wait until the Edge sees its providers online."""
        node = self.nodes[index]
        node.stop()
        node.start()
        self.wait_online()

    # --- observation -------------------------------------------------------------------------

    def send_chat(
        self, model: str, *, stream: bool = False, token: str | None = None
    ) -> http.client.HTTPConnection:
        """POST a chat completion and return without reading: the caller reads or drops it."""
        conn = http.client.HTTPConnection("127.0.0.1", self.ports["openai"], timeout=30)
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        if stream:
            body["stream"] = True
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(body),
            headers={
                "Authorization": f"Bearer {token or self.token}",
                "Content-Type": "application/json",
            },
        )
        return conn

    def chat_status(self, model: str) -> int:
        """A chat completion of ``model`` read to its end: its HTTP status."""
        conn = self.send_chat(model)
        try:
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    def refresh(self, mode: str, document: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """``POST /refresh`` (``dry_run`` or ``apply``) with a whole document; (status, report)."""
        body = json.dumps({"mode": mode, "config": document}).encode()
        request = urllib.request.Request(
            self.control_url + "/refresh",
            data=body,
            headers={"Content-Type": "application/json", **self.control_headers()},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def control_headers(self) -> dict[str, str]:
        """The bearer header the control listener needs when ``admin.token`` is set."""
        return {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}

    def pool_snapshot(self) -> dict[str, Any]:
        request = urllib.request.Request(self.control_url + "/pool", headers=self.control_headers())
        with urllib.request.urlopen(request, timeout=5) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]

    def provider(self, provider_id: str) -> dict[str, Any]:
        return provider_row(self.pool_snapshot(), provider_id)

    def metrics_text(self) -> str:
        """The control listener's ``GET /metrics`` (Prometheus text)."""
        request = urllib.request.Request(
            self.control_url + "/metrics", headers=self.control_headers()
        )
        with urllib.request.urlopen(request, timeout=5) as resp:
            return str(resp.read().decode())

    def metrics(self) -> list[Sample]:
        """Every sample of the control listener's ``GET /metrics``."""
        families = text_string_to_metric_families(self.metrics_text())
        return [sample for family in families for sample in family.samples]

    async def until(
        self,
        done: Callable[[dict[str, Any]], bool],
        what: str = "the condition",
        within: float = 10.0,
    ) -> None:
        """``wait_until`` for async tests: polls ``/pool`` off the event loop, so the loop's own
        requests keep moving."""
        await asyncio.to_thread(self.wait_until, done, within, what)

    def wait_until(
        self,
        done: Callable[[dict[str, Any]], bool],
        timeout: float = 10.0,
        what: str = "the condition",
    ) -> None:
        """Poll ``/pool`` until ``done(snapshot)`` holds; AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        snapshot: dict[str, Any] = {}
        while time.monotonic() < deadline:
            snapshot = self.pool_snapshot()
            if done(snapshot):
                return
            time.sleep(0.02)
        raise AssertionError(
            f"{what} not reached within {timeout}s: {snapshot}\n{self.logs()[-4000:]}"
        )

    def wait_online(self, timeout: float = START_TIMEOUT_S) -> None:
        """Every provider of every running Node is online in the pool."""
        running = {
            spec["id"]
            for spec, proc in zip(self._nodes_spec, self.nodes, strict=False)
            if proc.alive()
        }

        def ready(snap: dict[str, Any]) -> bool:
            rows = [p for p in snap["providers"] if p["node_id"] in running]
            return bool(rows) and all(p["online"] for p in rows)

        self.wait_until(ready, timeout, "providers online")

    @contextlib.contextmanager
    def clean_slate(self) -> Iterator[None]:
        """Around one test: every fake upstream's requests and faults cleared before and after
        (a stall left by a failed test must not hold the next one), a Node that died restarted,
        then every lease released and the queue empty (R-POOL-9)."""
        self.reset_upstreams()
        yield
        self.reset_upstreams()
        for index, node in enumerate(self.nodes):
            if not node.alive():
                self.restart_node(index)
        self.wait_idle()

    def reset_upstreams(self) -> None:
        """Clear every fake upstream's recorded requests and injected faults."""
        for upstream in self.upstreams.values():
            upstream.reset()

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Every lease released and the queue empty (R-POOL-9); raises after ``timeout``."""

        def idle(snap: dict[str, Any]) -> bool:
            return snap["queue_depth"] == 0 and all(
                p["in_flight"] == 0 and p["long_in_flight"] == 0 and p["queued"] == 0
                for p in snap["providers"]
            )

        self.wait_until(idle, timeout, "an idle pool")

    def ledger(self, table: str = "pool_usagebucket") -> list[dict[str, Any]]:
        """Every row of the running Edge's usage ledger (its own SQLite file), as dicts; or of
        its request log (``pool_requestlogentry``)."""
        assert table in ("pool_usagebucket", "pool_requestlogentry"), table
        with contextlib.closing(sqlite3.connect(self.dir / "edge.sqlite3", timeout=10)) as db:
            db.row_factory = sqlite3.Row
            return [dict(row) for row in db.execute(f"select * from {table}")]

    def logs(self) -> str:
        parts = []
        for proc in [self.edge, *self.nodes]:
            if proc is not None and proc.log.exists():
                parts.append(f"--- {proc.name} ---\n{proc.log.read_text(errors='replace')}")
        return "\n".join(parts)
