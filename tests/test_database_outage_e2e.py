"""PostgreSQL gone under load (R-HA-3, docs/scale-out.md "PostgreSQL gone"): a real Edge
(runedge) on a PostgreSQL cluster of the test's own, a real Node and a fake upstream. The
cluster is stopped: ``/v1`` keeps answering from the active snapshot, ``/healthz`` stays 200,
the admin, the REST API and ``/refresh`` answer 503 ``database_unavailable`` with one
sentence; started again, every request-log and ledger row made meanwhile is written."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.own_postgres import OwnPostgres, available
from tests.support.processes import ROOT, child_env
from tests.support.scale_failures import eventually
from tests.support.stack import Stack

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not available(), reason="needs PostgreSQL's initdb and pg_ctl"),
]


@pytest.fixture(scope="module")
def postgres() -> Iterator[OwnPostgres]:
    server = OwnPostgres()
    server.init()
    server.start()
    try:
        server.query("CREATE DATABASE iop", database="postgres")
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0", "--skip-checks"],
            cwd=ROOT,
            env=child_env({"DATABASE_URL": server.url("iop")}),
            check=True,
            capture_output=True,
            timeout=300,
        )
        yield server
    finally:
        with contextlib.suppress(RuntimeError):  # stopped already
            server.stop()
        server.remove()


def get(url: str, **headers: str) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def gone(status: int, body: bytes) -> bool:
    if status != 503:
        return False
    error = json.loads(body)["error"]
    return error["code"] == "database_unavailable" and error["message"].count(".") == 0


def rows(postgres: OwnPostgres) -> tuple[int, int]:
    """(request-log rows, requests counted in the usage ledger)."""
    logged = postgres.query("SELECT count(*) FROM pool_requestlogentry")[0][0]
    counted = postgres.query("SELECT coalesce(sum(requests), 0) FROM pool_usagebucket")[0][0]
    return int(logged), int(counted)  # type: ignore[call-overload]


def test_postgresql_stopped_under_load_v1_serves_control_plane_503_rows_wait_r_ha_3(
    postgres: OwnPostgres, tmp_path
) -> None:
    with Stack(tmp_path, env={"DATABASE_URL": postgres.url("iop")}) as stack:
        before = [stack.chat_status("gpt-test") for _ in range(5)]
        assert before == [200] * 5
        eventually(lambda: rows(postgres) == (5, 5), "the first rows written", within=30)

        postgres.stop()
        stopped = time.monotonic()
        during = [stack.chat_status("gpt-test") for _ in range(40)]
        assert during == [200] * 40  # /v1 from the active snapshot, the database gone
        assert get(stack.openai_url + "/healthz")[0] == 200
        assert gone(*get(stack.openai_url + "/admin/"))
        assert gone(*get(stack.openai_url + "/api/revisions/"))
        status, report = stack.refresh("dry_run", {"models": []})
        assert status == 503 and report["error"]["code"] == "database_unavailable"
        print(f"measured: 40 requests served in {time.monotonic() - stopped:.1f} s without "
              "PostgreSQL, every one 200")  # fmt: skip

        postgres.start()
        started = time.monotonic()
        took = eventually(lambda: rows(postgres) == (45, 45), "the waiting rows written")
        print(f"measured: rows written {took:.1f} s after PostgreSQL answered again")
        assert started and get(stack.openai_url + "/admin/")[0] in (200, 302)
        assert get(stack.openai_url + "/healthz")[0] == 200
