"""R-SCALE-9: a database or Redis an Edge cannot use stops ``runedge`` at start with one line
that says what to do, exit 1, never a traceback; real runedge processes, each case its own
unusable service (docs/scale-out.md, "Start refusals")."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.cluster import with_database
from tests.support.old_redis import OldRedis
from tests.support.processes import EDGE_YAML, ROOT, child_env, free_port

DATABASE = os.environ.get("IOP_TEST_DATABASE_URL", "")
needs_postgres = pytest.mark.skipif(
    not DATABASE.startswith(("postgres://", "postgresql://")),
    reason="needs PostgreSQL: set IOP_TEST_DATABASE_URL=postgresql://...",
)
pytestmark = pytest.mark.slow


def refused(env: dict[str, str], tmp_path: Path) -> str:
    """Run ``runedge`` with ``env``; assert it refused cleanly; its one line."""
    done = subprocess.run(
        [sys.executable, "manage.py", "runedge", "--config", str(EDGE_YAML)],
        cwd=ROOT,
        env=child_env({"IOP_VAR_DIR": str(tmp_path), **env}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "IOP Edge ready" not in done.stdout, done
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("CommandError: cannot start: "), done.stderr
    return lines[-1]


def admin(statement: str) -> None:
    import psycopg

    with psycopg.connect(with_database(DATABASE, "postgres"), autocommit=True) as db:
        db.execute(statement)  # type: ignore[arg-type]


@pytest.fixture
def empty_database() -> Iterator[str]:
    name = f"iop_refusals_{secrets.token_hex(4)}"
    admin(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(DATABASE, name)
    finally:
        admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def migrated_database() -> Iterator[str]:
    name = f"iop_refusals_{secrets.token_hex(4)}"
    admin(f'CREATE DATABASE "{name}"')
    url = with_database(DATABASE, name)
    try:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0", "--skip-checks"],
            cwd=ROOT,
            env=child_env({"DATABASE_URL": url}),
            check=True,
            capture_output=True,
            timeout=180,
        )
        yield url
    finally:
        admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_embedded_default_on_an_unmigrated_sqlite_file_says_to_migrate_r_scale_9(tmp_path):
    """R-SCALE-9 (and the embedded default of one Edge): a new SQLite file."""
    line = refused({"DATABASE_URL": f"sqlite:///{tmp_path / 'new.sqlite3'}"}, tmp_path)
    assert "is not migrated" in line and "run `python manage.py migrate`" in line


@needs_postgres
def test_an_unmigrated_shared_postgresql_says_to_migrate_r_scale_9(tmp_path, empty_database):
    line = refused(
        {"DATABASE_URL": empty_database, "IOP_REDIS_URL": "redis://127.0.0.1:1/0"}, tmp_path
    )
    assert "is not migrated" in line and "run `python manage.py migrate`" in line


def test_a_database_that_does_not_answer_says_so_r_scale_9(tmp_path):
    url = f"postgresql://iop@127.0.0.1:{free_port()}/iop"
    line = refused({"DATABASE_URL": url}, tmp_path)
    assert "the database of DATABASE_URL does not answer" in line and "check DATABASE_URL" in line


@pytest.mark.skipif(not os.environ.get("IOP_TEST_REDIS_URL"), reason="needs IOP_TEST_REDIS_URL")
def test_a_port_that_is_not_postgresql_says_so_within_its_bound_r_scale_9(tmp_path):
    """DATABASE_URL pointing at the Redis server's port: it accepts the connection and never
    answers as PostgreSQL would; the check gives up after its connect timeout."""
    parts = urlsplit(os.environ["IOP_TEST_REDIS_URL"])
    url = f"postgresql://iop@{parts.hostname}:{parts.port or 6379}/iop"
    line = refused({"DATABASE_URL": url}, tmp_path)
    assert "did not answer within 10 s: is that address a PostgreSQL server?" in line


@needs_postgres
def test_a_redis_that_does_not_answer_says_so_r_scale_9(tmp_path, migrated_database):
    env = {"DATABASE_URL": migrated_database, "IOP_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    line = refused(env, tmp_path)
    assert "Redis at IOP_REDIS_URL does not answer (connection refused)" in line


@needs_postgres
def test_a_port_that_is_not_redis_says_so_r_scale_9(tmp_path, migrated_database):
    """IOP_REDIS_URL pointing at the PostgreSQL server's port."""
    parts = urlsplit(DATABASE)
    url = f"redis://{parts.hostname}:{parts.port or 5432}/0"
    line = refused({"DATABASE_URL": migrated_database, "IOP_REDIS_URL": url}, tmp_path)
    assert "does not point at a Redis server" in line and "check its host and port" in line


@needs_postgres
def test_a_redis_older_than_the_minimum_says_which_is_needed_r_scale_9(tmp_path, migrated_database):
    with OldRedis("6.2.14") as old:
        line = refused({"DATABASE_URL": migrated_database, "IOP_REDIS_URL": old.url}, tmp_path)
    assert "is version 6.2.14; scale-out needs Redis 7.0 or newer" in line


# --- Redis Sentinel (R-HA-1): each refusal one line, before anything listens -------------------


@pytest.fixture(scope="module")
def two_sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """Two sentinels naming different primaries for one service (the ports of each)."""
    from tests.support.sentinel import Server, start_sentinel

    directory = tmp_path_factory.mktemp("sentinels")
    started: list[Server] = []
    try:
        for name in ("one", "two"):
            primary = Server(directory, f"primary-{name}")
            primary.start()
            started += [primary, start_sentinel(directory, f"sentinel-{name}", primary.port)]
        yield started[1].port, started[3].port
    finally:
        for server in started:
            server.kill()


def sentinel_url(*ports: int, service: str = "iop-test") -> str:
    return f"redis+sentinel://{','.join(f'127.0.0.1:{p}' for p in ports)}/{service}/0"


@needs_postgres
def test_a_sentinel_url_naming_no_reachable_sentinel_says_so_r_ha_1(tmp_path, migrated_database):
    url = sentinel_url(free_port(), free_port())
    line = refused({"DATABASE_URL": migrated_database, "IOP_REDIS_URL": url}, tmp_path)
    assert "no sentinel named in IOP_REDIS_URL answers (tried 127.0.0.1:" in line


@needs_postgres
def test_a_service_the_sentinels_do_not_know_says_so_r_ha_1(
    tmp_path, migrated_database, two_sentinels
):
    url = sentinel_url(two_sentinels[0], service="not-monitored")
    line = refused({"DATABASE_URL": migrated_database, "IOP_REDIS_URL": url}, tmp_path)
    assert "do not know the service 'not-monitored'" in line


@needs_postgres
def test_sentinels_that_disagree_on_the_primary_say_so_r_ha_1(
    tmp_path, migrated_database, two_sentinels
):
    url = sentinel_url(*two_sentinels)
    line = refused({"DATABASE_URL": migrated_database, "IOP_REDIS_URL": url}, tmp_path)
    assert "disagree on the primary of 'iop-test'" in line and " says 127.0.0.1:" in line
