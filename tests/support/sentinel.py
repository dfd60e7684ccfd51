"""A Redis Sentinel deployment of the test's own on loopback (R-HA-1): a primary, a replica
and three sentinels (``redis-server --sentinel``) on free ports, quick to decide
(``down-after-milliseconds`` ``DOWN_AFTER_MS``). ``url`` is the ``redis+sentinel://`` URL an
Edge is given. Helpers to wait for a replica in sync and for a promotion."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from tests.support.processes import free_port

SERVICE = "iop-test"
DOWN_AFTER_MS = 500
FAILOVER_TIMEOUT_MS = 3000
WAIT_S = 30.0


def _wait(predicate: object, what: str, within: float = WAIT_S) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            if predicate():  # type: ignore[operator]
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {within:.0f} s")
        time.sleep(0.05)  # waiting for child processes, not for the code under test


class Server:
    """One redis-server process (no persistence) on a free port."""

    def __init__(self, directory: Path, name: str, conf: Path | None = None) -> None:
        self.port = free_port()
        self.name = name
        self.directory = directory
        self.conf = conf  # a sentinel's config file (a sentinel rewrites it)
        self.extra: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.conf is not None:
            argv = ["redis-server", str(self.conf), "--sentinel"]
        else:
            argv = ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save",
                    "", "--appendonly", "no", "--daemonize", "no", "--dir", str(self.directory),
                    *self.extra]  # fmt: skip
        with (self.directory / f"{self.name}.log").open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        _wait(lambda: self.client().ping(), f"{self.name} answering")

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=5)

    def info(self, section: str) -> dict[str, str]:
        with self.client() as c:
            return {k: str(v) for k, v in c.info(section).items()}

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=WAIT_S)
            self.proc = None


class SentinelDeployment:
    """Primary, replica, three sentinels; ``url`` names them all."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.primary = Server(directory, "primary")
        self.replica = Server(directory, "replica")
        self.sentinels: list[Server] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> None:
        self.primary.start()
        self.replica.extra = ["--replicaof", "127.0.0.1", str(self.primary.port)]
        self.replica.start()
        in_sync(self.primary, self.replica)
        for i in range(3):
            self.sentinels.append(
                start_sentinel(self.directory, f"sentinel-{i}", self.primary.port, quorum=2)
            )
        # Every sentinel knows the replica and the other sentinels before a test kills anything.
        _wait(
            lambda: all(self.sentinel_view(s)["num-slaves"] == 1
                        and self.sentinel_view(s)["num-other-sentinels"] == 2
                        for s in self.sentinels),
            "the sentinels know the replica and each other",
        )  # fmt: skip

    def sentinel_view(self, sentinel: Server) -> dict[str, object]:
        with sentinel.client() as c:
            return dict(c.sentinel_master(SERVICE))

    def primary_ports(self) -> set[int]:
        """The ports the sentinels name as the primary (more than one while they disagree)."""
        ports = set()
        for s in self.sentinels:
            with s.client() as c:
                ports.add(int(c.sentinel_get_master_addr_by_name(SERVICE)[1]))
        return ports

    def wait_promoted(self, port: int) -> float:
        """Until every sentinel names ``port`` the primary and it answers as one; seconds."""
        start = time.monotonic()

        def promoted() -> bool:
            return (
                self.primary_ports() == {port}
                and self.server(port).info("replication")["role"] == "master"
            )

        _wait(promoted, f"the server on port {port} promoted")
        return time.monotonic() - start

    def server(self, port: int) -> Server:
        return next(s for s in (self.primary, self.replica) if s.port == port)

    def stop(self) -> None:
        for server in (*self.sentinels, self.replica, self.primary):
            server.kill()


def start_sentinel(
    directory: Path, name: str, primary_port: int, *, quorum: int = 1, service: str = SERVICE
) -> Server:
    """A started sentinel watching the primary on ``primary_port`` as ``service``."""
    conf = directory / f"{name}.conf"
    sentinel = Server(directory, name, conf)
    conf.write_text(
        f"port {sentinel.port}\nbind 127.0.0.1\ndir {directory}\n"
        f"sentinel monitor {service} 127.0.0.1 {primary_port} {quorum}\n"
        f"sentinel down-after-milliseconds {service} {DOWN_AFTER_MS}\n"
        f"sentinel failover-timeout {service} {FAILOVER_TIMEOUT_MS}\n"
        f"sentinel parallel-syncs {service} 1\n"
    )
    sentinel.start()
    return sentinel


def in_sync(primary: Server, replica: Server) -> None:
    """Until ``replica`` is linked to ``primary`` and has every write it has sent."""

    def synced() -> bool:
        r = replica.info("replication")
        p = primary.info("replication")
        return r.get("master_link_status") == "up" and r.get("master_repl_offset") == p.get(
            "master_repl_offset"
        )

    _wait(synced, f"{replica.name} in sync with {primary.name}")


@contextlib.contextmanager
def sentinel_deployment(directory: Path) -> Iterator[SentinelDeployment]:
    deployment = SentinelDeployment(directory)
    try:
        deployment.start()
        yield deployment
    finally:
        deployment.stop()
