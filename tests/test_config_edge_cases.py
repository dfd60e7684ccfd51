"""Edge cases of config loading, the catalog round trip and refresh reports: odd URLs, id
lengths, shared listener ports, profile edits (R-PROF-6, R-AUTH-3, R-CFG-5, R-REF-1, R-REF-4)."""

from __future__ import annotations

import copy

import pytest

from catalog.config import ConfigError, load_snapshot
from catalog.config.profiles import RuntimeProfile
from refresh.report import diff_report
from tests.support.config_examples import example_document

UPPER_ABSOLUTE = "HTTPS://api.example.com/v1/chat/completions"


def _with_custom_profile(operations: dict[str, str]) -> dict:
    document = example_document()
    document["protocol_profiles"] = {
        "custom": {
            "base": "openai",
            "base_url": "http://127.0.0.1:9100/v1",
            "operations": {"models": "/models", **operations},
            "capabilities": ["models", "chat", "streaming"],
        }
    }
    document["nodes"][0]["providers"].append({"id": "custom-a", "profile": "custom"})
    return document


def _issue_paths(document: dict) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_snapshot(document)
    return [issue.path for issue in caught.value.issues]


def test_absolute_operation_url_with_uppercase_scheme_is_returned_unchanged() -> None:
    """R-PROF-6: an absolute operation URL (schemes are case-insensitive) is returned as is."""
    profile = RuntimeProfile(
        name="upper",
        base=None,
        adapter="openai_compat",
        driver="openai_chat",
        base_url="http://127.0.0.1:9100/v1",
        operations={"chat_completions": UPPER_ABSOLUTE},
    )
    assert profile.resolve_operation_url("chat_completions") == UPPER_ABSOLUTE


def test_operation_url_with_uppercase_scheme_and_userinfo_is_rejected() -> None:
    """R-AUTH-3 / no literal secrets: user-info in any endpoint is a load error."""
    document = _with_custom_profile(
        {"chat_completions": "HTTPS://user:literal-pw@api.example.com/v1/chat/completions"}
    )
    assert "protocol_profiles.custom.operations.chat_completions" in _issue_paths(document)


def test_base_url_with_bare_query_mark_never_yields_a_broken_operation_url() -> None:
    """R-PROF-6: a relative path is joined exactly once to the normalized base URL."""
    document = example_document()
    document["nodes"][0]["providers"][0]["base_url"] = "http://127.0.0.1:9001/v1?"
    try:
        snapshot = load_snapshot(document)
    except ConfigError as exc:
        assert "nodes[0].providers[0].base_url" in [issue.path for issue in exc.issues]
        return
    url = snapshot.providers["compat-a"].profile.resolve_operation_url("chat_completions")
    assert url == "http://127.0.0.1:9001/v1/chat/completions"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("where", "length"),
    [("node", 100), ("provider", 100), ("model", 200)],
)
def test_catalog_holds_every_id_length_the_loader_accepts(where: str, length: int) -> None:
    """R-CFG-5 / catalog round trip: a document the loader accepts imports and exports intact;
    one character more is a load error naming the path."""
    from catalog.documents import catalog_to_document, document_to_catalog

    too_long = long_ids(where, length + 1)
    with pytest.raises(ConfigError):
        load_snapshot(too_long)
    document = long_ids(where, length)
    snapshot = load_snapshot(document)
    document_to_catalog(document)
    assert load_snapshot(catalog_to_document()).digest == snapshot.digest


def long_ids(where: str, length: int) -> dict:
    document = example_document()
    if where == "node":
        document["nodes"][0]["id"] = "n" * length
    elif where == "provider":
        long_id = "p" * length
        document["nodes"][0]["providers"][1]["id"] = long_id
        document["models"][0]["providers"] = {"compat-a": "served-chat", long_id: "llama3"}
    else:
        document["models"][0]["id"] = "m" * length
    return document


def test_admin_and_openai_listeners_on_one_port_are_rejected() -> None:
    """R-REF-1: requests are routed by server port, so a shared port hides POST /refresh."""
    document = example_document()
    document["admin"]["listen"] = "127.0.0.1:8080"
    document["openai"]["listen"] = "127.0.0.2:8080"
    paths = _issue_paths(document)
    assert "admin.listen" in paths or "openai.listen" in paths


def test_profile_change_lists_the_providers_and_nodes_that_use_it() -> None:
    """R-REF-4: the report lists the changed providers and nodes (a profile edit changes them)."""
    old = _with_custom_profile({"chat_completions": "/chat/completions"})
    new = copy.deepcopy(old)
    new["protocol_profiles"]["custom"]["base_url"] = "http://127.0.0.1:9200/v1"
    report = diff_report(
        load_snapshot(old).document, load_snapshot(new).document, mode="dry_run", outcome="dry_run"
    ).as_dict()
    assert report["restart_required_paths"] == ['protocol_profiles["custom"].base_url']
    assert report["changed_providers"] == ["custom-a"]
    assert report["changed_nodes"] == ["node-a"]
