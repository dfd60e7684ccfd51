"""The embedded default stays: one Edge, the in-memory pool, SQLite (R-SCALE-1)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from catalog.config import load_snapshot
from iop_site.runtime import EdgeRuntime
from pool.engine import ProviderPool
from tests.support import ROOT

PROBE = (
    "import django; django.setup()\n"
    "from django.conf import settings\n"
    "print(settings.DATABASES['default']['ENGINE'])\n"
)


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
def test_without_database_url_the_edge_uses_sqlite(tmp_path):
    """R-SCALE-1: no DATABASE_URL (what `make run` leaves unset) means SQLite."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update({"DJANGO_SETTINGS_MODULE": "iop_site.settings", "IOP_VAR_DIR": str(tmp_path)})
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "django.db.backends.sqlite3"


async def test_the_runtime_leases_from_the_in_memory_pool():
    """R-SCALE-1: the Edge's runtime holds the in-memory ProviderPool, nothing shared."""
    runtime = EdgeRuntime(
        load_snapshot(
            {
                "edge": {"id": "e", "listen": "127.0.0.1:17100"},
                "admin": {"listen": "127.0.0.1:17101"},
                "openai": {"listen": "127.0.0.1:17102"},
            }
        )
    )
    try:
        assert type(runtime.pool) is ProviderPool
    finally:
        await runtime.aclose()
