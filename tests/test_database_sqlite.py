"""SQLite runs in WAL mode with immediate transactions (docs/refresh.md, "The database")."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from refresh.models import ConfigRevision
from tests.support import ROOT

pytestmark = pytest.mark.skipif(
    connection.vendor != "sqlite", reason="the SQLite options apply to SQLite only"
)

PROBE = (
    "from django.db import connection\n"
    "cursor = connection.cursor()\n"
    "cursor.execute('PRAGMA journal_mode')\n"
    "mode = cursor.fetchone()[0]\n"
    "cursor.execute('PRAGMA synchronous')\n"
    "print(mode, cursor.fetchone()[0], connection.transaction_mode)\n"
)


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
def test_a_database_file_is_in_wal_mode_with_normal_sync_and_immediate_transactions(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'iop.sqlite3'}",
        "IOP_VAR_DIR": str(tmp_path / "var"),
    }
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.split() == ["wal", "1", "IMMEDIATE"]  # synchronous=1 is NORMAL


def test_a_transaction_takes_the_write_lock_when_it_begins(transactional_db):
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        ConfigRevision.objects.exists()
    assert queries.captured_queries[0]["sql"] == "BEGIN IMMEDIATE"
