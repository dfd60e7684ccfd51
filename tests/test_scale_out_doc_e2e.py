"""docs/scale-out.md run as written, as a newcomer follows it (R-SCALE-2, R-SCALE-6, R-SCALE-7
docs): a copy of the checkout (a fresh clone) installed with the page's own commands (against
a local mirror of the package index, tests/support/wheelhouse.py), the shared database
migrated with them, three Edges started with them on this machine's PostgreSQL and Redis, a
Node listing every Edge, the page's checks and a request through the second host's Edge.

Every ``sh journey=NAME`` block of the page is run here (the one ``scale_local.py`` line by
``tests/test_scale_local_script_e2e.py``). The only changes to a block's text: the example
services (``postgresql://iop@db.internal:5432/iop``, ``redis://redis.internal:6379/0``)
become a new database of ``IOP_TEST_DATABASE_URL`` and ``IOP_TEST_REDIS_URL``; the example
hosts become ``127.0.0.1`` and their ports free ones (``wss://`` becomes ``ws://``: TLS is
tested on its own). Host B's Edge, which the page starts with the document's addresses,
gets free ports through ``IOP_*_LISTEN`` in its environment, standing in for another
machine. Every Edge gets a fresh ``IOP_REDIS_PREFIX`` (the Redis is shared with other tests)
and ``IOP_LEASE_TTL_S=2`` (a fresh prefix's recovery grace is one TTL)."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cluster import scale_out_redis_url, with_database
from tests.support.journeys import journey_blocks, printed_json, source_checkout, wait_for
from tests.support.ports import free_port
from tests.support.processes import ROOT, Proc, sha256_hex
from tests.support.upstream_loop import FakeUpstream
from tests.support.wheelhouse import DOWNLOAD_TIMEOUT_S, package_index

PAGE = ROOT / "docs" / "scale-out.md"
BLOCKS = journey_blocks(PAGE)
RUN_HERE = ("scale-install", "scale-migrate", "scale-edge-a", "scale-edge-b", "scale-edge-c",
            "scale-check", "scale-request")  # fmt: skip
RUN_ELSEWHERE = {
    "scale-local": "tests/test_scale_local_script_e2e.py",
    "scale-rediss": "tests/test_scale_rediss_e2e.py",
    "scale-sentinel": "tests/test_scale_sentinel_e2e.py",
    "scale-capacity": "tests/test_scale_capacity_e2e.py",
}
DATABASE = os.environ.get("IOP_TEST_DATABASE_URL", "")
EXAMPLE_DATABASE = "postgresql://iop@db.internal:5432/iop"
EXAMPLE_REDIS = "redis://redis.internal:6379/0"
HOST_A, HOST_A2 = (7700, 7701, 7702), (7710, 7711, 7712)  # (edge, admin, openai) ports
INSTALL_TIMEOUT_S = 900
START_TIMEOUT_S = 60.0
ROLES = ("edge", "admin", "openai")

pytestmark = pytest.mark.slow
needs_services = pytest.mark.skipif(
    not DATABASE.startswith(("postgres://", "postgresql://")) or scale_out_redis_url() is None,
    reason="needs PostgreSQL and Redis: set IOP_TEST_DATABASE_URL and IOP_TEST_REDIS_URL",
)


def test_every_command_block_of_the_page_is_tagged_and_run() -> None:
    """The page shows no command that no test runs: every ``sh`` block has a journey tag,
    each run here or by the test named for it."""
    text = PAGE.read_text()
    assert re.findall(r"^```(?:sh|bash|shell)\s*$", text, re.M) == []
    assert sorted(BLOCKS) == sorted([*RUN_HERE, *RUN_ELSEWHERE])
    for test in RUN_ELSEWHERE.values():  # that test reads its command from this page
        assert 'docs" / "scale-out.md' in (ROOT / test).read_text()


def yaml_block(after: str) -> Any:
    """The first ``yaml`` block of the page after the text ``after``."""
    text = PAGE.read_text()
    rest = text[text.index(after) :]
    return yaml.safe_load(re.search(r"^```yaml\n(.*?)^```$", rest, re.M | re.S).group(1))


@dataclass
class Host:
    """The machine the page's commands run on: the checkout copy, services and processes."""

    checkout: Path
    logs: Path
    database_url: str
    redis_url: str
    prefix: str
    upstream: FakeUpstream
    ports: dict[str, dict[str, int]] = field(default_factory=dict)  # edge-a/-b/-c -> role
    procs: list[Proc] = field(default_factory=list)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """A fresh shell on the host: nothing of this test's venv or Django settings."""
        drop = ("PYTHONPATH", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE", "DATABASE_URL")
        env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PYTEST_")}
        return {**env, "PYTHONUNBUFFERED": "1", "IOP_REDIS_PREFIX": self.prefix,
                "IOP_LEASE_TTL_S": "2", **(extra or {})}  # fmt: skip

    def substitute(self, text: str) -> str:
        text = text.replace(EXAMPLE_DATABASE, self.database_url)
        text = text.replace(EXAMPLE_REDIS, self.redis_url)
        a, b, c = self.ports["edge-a"], self.ports["edge-b"], self.ports["edge-c"]
        text = text.replace("wss://edge-a.internal:7700", f"ws://127.0.0.1:{a['edge']}")
        text = text.replace("wss://edge-b.internal:7700", f"ws://127.0.0.1:{b['edge']}")
        text = text.replace("wss://edge-a.internal:7710", f"ws://127.0.0.1:{c['edge']}")
        text = text.replace("edge-b.internal:7702", f"127.0.0.1:{b['openai']}")
        for example, edge in ((HOST_A, a), (HOST_A2, c)):
            for role, port in zip(ROLES, example, strict=True):
                text = text.replace(f":{port}", f":{edge[role]}")
        return text

    def run(self, block: str, extra: dict[str, str] | None = None, timeout: float = 120) -> str:
        """A block to its end in the checkout; its stdout (fail with its output)."""
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", self.substitute(BLOCKS[block])],
            cwd=self.checkout,
            env=self.env(extra),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, (
            f"{block}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
        return done.stdout

    def service(self, block: str, name: str, extra: dict[str, str] | None = None) -> Proc:
        """A block whose last command runs on (an Edge): the lines before it, then ``exec``."""
        commands = self.substitute(BLOCKS[block]).replace("\\\n", " ").strip().splitlines()
        script = "\n".join([*commands[:-1], "exec " + commands[-1]])
        proc = Proc(name, ["bash", "-e", "-c", script], self.env(extra), self.logs / f"{name}.log",
                    self.checkout)  # fmt: skip
        proc.start()
        self.procs.append(proc)
        return proc

    def wait_ready(self, proc: Proc) -> None:
        wait_for(
            lambda: "IOP Edge ready" in proc.log.read_text(errors="replace"),
            START_TIMEOUT_S,
            f"{proc.name} ready",
            check=proc.alive,
            log=lambda: proc.log.read_text(errors="replace")[-4000:],
        )

    def pool(self, edge: str) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.ports[edge]['admin']}/pool"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]


def document(host: Host, upstream: str, token: str, node_token: str) -> dict[str, Any]:
    """The shared document: the page's listen part (host A's ports), one Node, one group."""
    listen = yaml.safe_load(host.substitute(yaml.safe_dump(yaml_block("The listen part"))))
    return {
        "edge": {**listen["edge"], "bootstrap_dir": "var/bootstrap"},
        "admin": listen["admin"],
        "openai": {
            **listen["openai"],
            "principal_tokens": [
                {
                    "token_ref": "app",
                    "principal_ref": "team",
                    "token_hash_sha256": sha256_hex(token),
                }
            ],
        },
        "provider_pool": {"max_queue": 16, "queue_timeout_ms": 30000},
        "nodes": [
            {
                "id": "gpu-1",
                "token_hash_sha256": sha256_hex(node_token),
                "providers": [
                    {"id": "p-1", "profile": "openai", "base_url": f"{upstream}/v1", "capacity": 2}
                ],
            }
        ],
        "models": [{"id": "chat", "providers": {"p-1": "served"}}],
    }


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    import psycopg
    import redis

    directory = tmp_path_factory.mktemp("scale-doc")
    name = f"iop_scale_doc_{secrets.token_hex(4)}"
    admin = with_database(DATABASE, "postgres")
    with psycopg.connect(admin, autocommit=True) as db:
        db.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    (directory / "logs").mkdir()
    running = Host(
        source_checkout(directory / "checkout"),
        directory / "logs",
        with_database(DATABASE, name),
        str(scale_out_redis_url()),
        f"iop-doc-{secrets.token_hex(4)}",
        FakeUpstream("openai"),
        {edge: {role: free_port() for role in ROLES} for edge in ("edge-a", "edge-b", "edge-c")},
    )
    try:
        yield running
    finally:
        for proc in reversed(running.procs):
            proc.stop()
        running.upstream.stop()
        with psycopg.connect(admin, autocommit=True) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]
        client = redis.Redis.from_url(running.redis_url)
        keys = list(client.scan_iter(match=f"{running.prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


@needs_services
@pytest.mark.timeout(DOWNLOAD_TIMEOUT_S + INSTALL_TIMEOUT_S + 300)
def test_the_scale_out_page_as_written_runs_three_edges_that_serve_one_pool(host: Host):
    """docs/scale-out.md "Set up several Edges", every step as written: install, migrate,
    Edges A, B and a second one on host A, a Node listing all three, the checks (one
    revision, the Node's provider online on every Edge) and a request through host B."""
    started = time.monotonic()
    # a local mirror of the index (tests/support/wheelhouse.py)
    output = host.run("scale-install", package_index(), timeout=INSTALL_TIMEOUT_S)
    print(f"measured: the page's install took {time.monotonic() - started:.0f} s")
    assert (host.checkout / ".venv" / "bin" / "iop-node").exists(), output[-2000:]
    token, node_token = "app-" + secrets.token_urlsafe(24), "node-" + secrets.token_urlsafe(24)
    (host.checkout / "edge.yaml").write_text(
        yaml.safe_dump(document(host, host.upstream.url, token, node_token), sort_keys=False)
    )
    host.run("scale-migrate")
    host.wait_ready(host.service("scale-edge-a", "edge-a"))
    b = host.ports["edge-b"]
    host_b = {f"IOP_{role.upper()}_LISTEN": f"127.0.0.1:{b[role]}" for role in ROLES}
    edge_b = host.service("scale-edge-b", "edge-b", host_b)
    edge_c = host.service("scale-edge-c", "edge-c")
    host.wait_ready(edge_b)
    host.wait_ready(edge_c)
    urls = yaml.safe_load(host.substitute(yaml.safe_dump(yaml_block("### 4. Nodes"))))
    (host.checkout / "node.token").write_text(node_token)
    (host.checkout / "node.yaml").write_text(
        yaml.safe_dump({"node_id": "gpu-1", "token": {"file": "node.token"}, **urls})
    )
    node = Proc("gpu-1", [".venv/bin/iop-node", "--config", "node.yaml"], host.env(),
                host.logs / "gpu-1.log", host.checkout)  # fmt: skip
    node.start()
    host.procs.append(node)
    for edge in ("edge-a", "edge-b", "edge-c"):
        wait_for(
            lambda e=edge: all(p["online"] for p in host.pool(e)["providers"]),
            START_TIMEOUT_S,
            f"the Node's provider online on {edge}",
            log=lambda: node.log.read_text(errors="replace")[-3000:],
        )
    revisions = {host.pool(edge)["revision"] for edge in ("edge-a", "edge-b", "edge-c")}
    assert len(revisions) == 1 and None not in revisions  # one revision for all three
    check = host.run("scale-check")
    pool, health = printed_json(check)
    assert pool["revision"] in revisions and pool["providers"][0]["node_id"] == "gpu-1"
    assert health == {"status": "ok"}
    answer = None
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:  # a fresh prefix answers pool_recovering for one TTL
        (answer,) = printed_json(host.run("scale-request", {"TOKEN": token}))
        if answer.get("error", {}).get("code") != "pool_recovering":
            break
        time.sleep(0.2)
    assert answer is not None and answer["choices"][0]["message"]["content"], answer
    assert host.upstream.server.requests, "the request reached the upstream through the Node"
