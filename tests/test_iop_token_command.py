"""`manage.py iop_token`: mint, print once, store only the sha256 (R-CFG-12)."""

from __future__ import annotations

import hashlib
import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from catalog.config import parse_text
from catalog.documents import catalog_to_document, document_to_catalog
from catalog.models import Node, PrincipalToken, Provider
from tests.support.processes import EDGE_YAML


@pytest.fixture
def catalog() -> None:
    document_to_catalog(parse_text(EDGE_YAML.read_text()))


def mint(*args: str) -> dict:
    out = StringIO()
    call_command("iop_token", "--json", *args, stdout=out, stderr=StringIO())
    return json.loads(out.getvalue())


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_minted_token_is_prefixed_random_and_printed_with_its_sha256():
    out = StringIO()
    call_command("iop_token", stdout=out)
    lines = dict(line.split(":", 1) for line in out.getvalue().splitlines() if ":" in line)
    token, digest = lines["token"].strip(), lines["sha256"].strip()
    assert token.startswith("iop_") and len(token) > 40
    assert digest == sha256(token)


def test_json_output_and_two_mints_differ():
    first, second = mint(), mint()
    assert set(first) == {"token", "sha256"}
    assert first["sha256"] == sha256(first["token"])
    assert first["token"] != second["token"]


@pytest.mark.django_db
def test_node_option_stores_only_the_hash_on_that_node(catalog):
    minted = mint("--node", "node-local")
    assert Node.objects.get(key="node-local").token_hash_sha256 == minted["sha256"]
    assert minted["token"] not in json.dumps(catalog_to_document())


@pytest.mark.django_db
def test_unknown_node_is_an_error_and_changes_nothing(catalog):
    before = catalog_to_document()
    with pytest.raises(CommandError, match="no node with id 'ghost'"):
        mint("--node", "ghost")
    assert catalog_to_document() == before


@pytest.mark.django_db
def test_principal_option_adds_a_new_entry_last(catalog):
    """R-CFG-12: the entry holds token_ref, the hash, principal_ref and alias; no raw token."""
    minted = mint("--principal", "app-new", "--principal-ref", "team-ops", "--alias", "new")
    entry = catalog_to_document()["openai"]["principal_tokens"][-1]
    assert entry == {
        "token_ref": "app-new",
        "token_hash_sha256": minted["sha256"],
        "principal_ref": "team-ops",
        "alias": "new",
    }


@pytest.mark.django_db
def test_principal_option_replaces_the_hash_of_an_existing_entry(catalog):
    minted = mint("--principal", "app-ci")
    entry = PrincipalToken.objects.get(token_ref="app-ci")
    assert (entry.token_hash_sha256, entry.principal_ref) == (minted["sha256"], "team-research")
    assert PrincipalToken.objects.count() == 2


@pytest.mark.django_db
def test_new_principal_without_principal_ref_is_an_error(catalog):
    with pytest.raises(CommandError, match="needs --principal-ref"):
        mint("--principal", "app-new")
    assert not PrincipalToken.objects.filter(token_ref="app-new").exists()


@pytest.mark.django_db
def test_nothing_is_stored_or_printed_when_the_catalog_would_not_load(catalog):
    Provider.objects.filter(key="ollama-local").update(capacity=0)  # already broken
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError, match="nothing stored"):
        call_command("iop_token", "--node", "node-local", stdout=out, stderr=err)
    assert "nodes[0].providers[0].capacity" in err.getvalue()
    assert out.getvalue() == ""
    original = parse_text(EDGE_YAML.read_text())["nodes"][0]["token_hash_sha256"]
    assert Node.objects.get(key="node-local").token_hash_sha256 == original
