"""`manage.py iop_config validate|import|export` (R-CFG-5: every error by path, all or nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from catalog.config import load_snapshot, parse_text
from catalog.documents import catalog_is_empty, catalog_to_document, document_to_catalog
from catalog.models import Node
from tests.support.processes import EDGE_YAML, ROOT

BROKEN_PATHS = (
    "nodes[0].providers[0].capacity",
    "nodes[0].providers[1].long_context_capacity",
    "openai.long_context_threshold_tokens",
)


@pytest.fixture
def broken_file(tmp_path: Path) -> Path:
    document = parse_text(EDGE_YAML.read_text())
    document["nodes"][0]["providers"][0]["capacity"] = 0
    document["nodes"][0]["providers"][1]["long_context_capacity"] = 99
    document["openai"]["long_context_threshold_tokens"] = -1
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("iop_config", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def run_failing(*args: str) -> tuple[str, str]:
    err = StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("iop_config", *args, stdout=StringIO(), stderr=err)
    return str(caught.value), err.getvalue()


def test_validate_prints_ok_for_the_shipped_config():
    out, err = run("validate", str(EDGE_YAML))
    assert out.strip() == "ok"
    assert err == ""


def test_validate_prints_every_error_with_its_path_one_per_line(broken_file):
    message, err = run_failing("validate", str(broken_file))
    lines = err.strip().splitlines()
    for path in BROKEN_PATHS:
        assert any(line.startswith(f"{path}: ") for line in lines), path
    assert "error(s)" in message


def test_validate_reports_a_yaml_syntax_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("edge: [unclosed\n")
    _, err = run_failing("validate", str(path))
    assert err.strip()


def test_validate_reports_a_missing_file(tmp_path):
    message, _ = run_failing("validate", str(tmp_path / "absent.yaml"))
    assert "cannot read" in message


@pytest.mark.django_db
def test_import_loads_the_catalog_and_export_gives_the_same_config():
    out, _ = run("import", str(EDGE_YAML))
    assert "1 nodes, 3 providers, 2 model groups" in out
    exported, _ = run("export")
    original = parse_text(EDGE_YAML.read_text())
    assert load_snapshot(yaml.safe_load(exported)) == load_snapshot(original)


@pytest.mark.django_db
def test_export_as_json_is_the_same_document():
    document_to_catalog(parse_text(EDGE_YAML.read_text()))
    exported, _ = run("export", "--format", "json")
    assert json.loads(exported) == catalog_to_document()


@pytest.mark.django_db
def test_import_of_a_broken_file_prints_every_error_and_changes_nothing(broken_file):
    document_to_catalog(parse_text(EDGE_YAML.read_text()))
    before = catalog_to_document()
    message, err = run_failing("import", str(broken_file))
    for path in BROKEN_PATHS:
        assert path in err
    assert "nothing changed" in message
    assert catalog_to_document() == before


@pytest.mark.django_db
def test_import_if_empty_skips_a_catalog_that_has_rows(tmp_path):
    document_to_catalog(parse_text(EDGE_YAML.read_text()))
    Node.objects.filter(key="node-local").update(alias="kept")
    out, _ = run("import", "--if-empty", str(EDGE_YAML))
    assert "nothing imported" in out
    assert Node.objects.get(key="node-local").alias == "kept"


@pytest.mark.django_db
def test_import_if_empty_imports_into_an_empty_catalog():
    assert catalog_is_empty()
    run("import", "--if-empty", str(EDGE_YAML))
    assert Node.objects.filter(key="node-local").exists()


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
def test_command_line_exit_status_is_0_when_valid_and_1_with_errors_on_stderr(
    broken_file, tmp_path
):
    env = {**os.environ, "IOP_VAR_DIR": str(tmp_path / "var")}
    argv = [sys.executable, str(ROOT / "manage.py"), "iop_config", "validate"]
    good = subprocess.run(
        [*argv, str(EDGE_YAML)], env=env, capture_output=True, text=True, timeout=60
    )
    assert (good.returncode, good.stdout.strip()) == (0, "ok")
    bad = subprocess.run(
        [*argv, str(broken_file)], env=env, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 1
    for path in BROKEN_PATHS:
        assert f"{path}: " in bad.stderr
    assert bad.stdout == ""
