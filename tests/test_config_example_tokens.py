"""Published example token hashes authenticate no one outside the test suite: they are a load
error naming the path and saying how to mint a token (docs/configuration.md, "Token hashes")."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from catalog.config import load_snapshot
from catalog.config.rules.example_tokens import ALLOW_ENV
from tests.support.config import load_issues
from tests.support.config_examples import example_document

ROOT = Path(__file__).resolve().parent.parent
EDGE_YAML = ROOT / "configs" / "edge.yaml"


@pytest.fixture
def outside_tests(monkeypatch):
    monkeypatch.delenv(ALLOW_ENV)


def test_the_shipped_example_is_refused_with_every_example_hash_named(outside_tests):
    issues = load_issues(yaml.safe_load(EDGE_YAML.read_text()))
    assert [issue.split(":")[0] for issue in issues] == [
        "nodes[0].token_hash_sha256",
        "openai.principal_tokens[0].token_hash_sha256",
        "openai.principal_tokens[1].token_hash_sha256",
    ]
    assert 'the published example token "foo"' in issues[0]
    assert "python manage.py iop_token --node node-local" in issues[0]
    assert "python manage.py iop_token --principal app-notebook" in issues[1]


def test_a_hash_of_a_common_word_is_refused(outside_tests):
    document = example_document()
    document["nodes"][0]["token_hash_sha256"] = hashlib.sha256(b"password").hexdigest()
    issues = load_issues(document)
    assert issues[0].startswith("nodes[0].token_hash_sha256: is the sha256 of the published")


def test_minted_hashes_load_outside_tests(outside_tests):
    document = example_document()
    document["nodes"][0]["token_hash_sha256"] = hashlib.sha256(b"iop_a-real-token").hexdigest()
    document["openai"]["principal_tokens"] = [
        {
            "token_ref": "app",
            "token_hash_sha256": hashlib.sha256(b"iop_another").hexdigest(),
            "principal_ref": "team",
        }
    ]
    assert load_snapshot(document).principal_tokens[0].token_ref == "app"


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
def test_runedge_refuses_to_start_on_the_example_instead_of_letting_guessers_in(tmp_path):
    """The fallback to configs/edge.yaml (empty database, no --config) is refused at start."""
    env = {
        "PATH": "/usr/bin:/bin",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "IOP_VAR_DIR": str(tmp_path / "var"),
    }
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v", "0"], env=env, cwd=ROOT, check=True, timeout=120)
    result = subprocess.run(
        [*manage, "runedge"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "nodes[0].token_hash_sha256: is the sha256 of the published example" in result.stderr
    assert "IOP Edge ready" not in result.stdout
