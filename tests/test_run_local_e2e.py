"""`make run`'s first start (scripts/run_local.py): every token is freshly minted and the
catalog it imports loads without the test suite's opt-in for example hashes (R-CFG-12)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys

import pytest
import yaml

from catalog.config.rules.example_tokens import ALLOW_ENV, WELL_KNOWN_HASHES
from tests.support import ROOT

pytestmark = pytest.mark.slow


def test_first_run_mints_every_token_and_imports_a_catalog_that_loads_outside_tests(
    tmp_path, monkeypatch
):
    monkeypatch.delenv(ALLOW_ENV)
    monkeypatch.setenv("IOP_VAR_DIR", str(tmp_path / "var"))
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'db.sqlite3'}")
    spec = importlib.util.spec_from_file_location("run_local", ROOT / "scripts" / "run_local.py")
    assert spec is not None and spec.loader is not None
    run_local = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_local)
    run_local.VAR.mkdir(parents=True)
    run_local.manage("migrate", "--noinput", "-v", "0")

    tokens = run_local.first_run_setup()

    assert json.loads(run_local.TOKENS.read_text()) == tokens
    assert oct(run_local.TOKENS.stat().st_mode & 0o777) == "0o600"
    document = yaml.safe_load(run_local.manage("iop_config", "export", capture=True))
    node = next(n for n in document["nodes"] if n["id"] == "node-local")
    principals = {
        p["token_ref"]: p["token_hash_sha256"] for p in document["openai"]["principal_tokens"]
    }

    def sha(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    assert node["token_hash_sha256"] == sha(tokens["node"])
    assert principals == {"app-notebook": sha(tokens["client"]), "app-ci": sha(tokens["ci"])}
    assert not set(WELL_KNOWN_HASHES) & {node["token_hash_sha256"], *principals.values()}
    exported = tmp_path / "exported.yaml"
    exported.write_text(yaml.safe_dump(document))
    check = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "iop_config", "validate", str(exported)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (check.returncode, check.stdout.strip()) == (0, "ok"), check.stderr
