"""R-REF-4 / R-REF-6: the report's stable, sorted, never-null lists, with no secret in it."""

from __future__ import annotations

import copy
import json
import random

from catalog.config import load_file
from refresh.diff import diff_documents, parse_pattern, render
from refresh.report import REDACTED, diff_report, error_report, values_text
from tests.support.processes import EDGE_YAML

BASE = load_file(EDGE_YAML).document
LISTS = (
    "changed_nodes",
    "changed_providers",
    "changed_models",
    "live_paths",
    "restart_required_paths",
    "changes",
    "pushed_nodes",
    "errors",
)
KEYS = {*LISTS, "mode", "outcome", "valid", "changed", "applied", "revision", "parent", "active"}


def report_of(candidate: dict, old: dict | None = BASE) -> dict:
    return diff_report(old, candidate, mode="dry_run", outcome="dry_run").as_dict()


def test_a_no_change_report_has_every_list_present_and_empty():
    report = report_of(copy.deepcopy(BASE))
    assert set(report) == KEYS
    for name in LISTS:
        assert report[name] == [], name
    assert report["changed"] is False


def test_an_invalid_report_has_the_same_keys_and_lists():
    report = error_report("apply", "invalid", [("nodes[0].id", "bad")]).as_dict()
    assert set(report) == KEYS
    assert all(isinstance(report[name], list) for name in LISTS)
    assert report["errors"] == [{"path": "nodes[0].id", "message": "bad"}]


def test_lists_are_sorted_and_the_json_is_byte_identical_whatever_the_input_order():
    candidate = copy.deepcopy(BASE)
    for spec in candidate["nodes"][0]["providers"]:
        spec["priority"] += 1
    candidate["models"][0]["usage_attribution"] = "model_group"
    candidate["models"][1]["providers"]["echo-cli"] = "echo-2"
    candidate["edge"]["listen"] = "127.0.0.1:7711"
    candidate["admin"]["listen"] = "127.0.0.1:7712"
    first = json.dumps(report_of(candidate))
    shuffled = copy.deepcopy(candidate)
    rng = random.Random(7)
    rng.shuffle(shuffled["nodes"][0]["providers"])
    rng.shuffle(shuffled["models"])
    shuffled["openai"]["principal_tokens"].reverse()
    assert json.dumps(report_of(shuffled)) == first
    report = json.loads(first)
    for name in LISTS:
        items = report[name]
        key = (lambda c: c["path"]) if name in ("changes", "errors") else (lambda c: c)
        assert items == sorted(items, key=key), name
    assert report["changed_models"] == ["echo", "qwen-local"]
    assert report["changed_providers"] == ["echo-cli", "ollama-local", "vllm-local"]
    assert report["changed_nodes"] == ["node-local"]


def test_reordering_entries_is_not_a_change():
    candidate = copy.deepcopy(BASE)
    candidate["nodes"][0]["providers"].reverse()
    candidate["models"].reverse()
    candidate["openai"]["principal_tokens"].reverse()
    mapping = candidate["models"][0]["providers"]
    candidate["models"][0]["providers"] = dict(reversed(mapping.items()))
    assert diff_documents(BASE, candidate) == []


def test_a_model_mapping_change_marks_the_provider_and_its_node_changed():
    """The Node's payload carries served models, so that Node changes (R-NODE-4)."""
    candidate = copy.deepcopy(BASE)
    candidate["models"][1]["providers"]["echo-cli"] = "echo-2"
    report = report_of(candidate)
    assert report["changed_models"] == ["echo"]
    assert report["changed_providers"] == ["echo-cli"]
    assert report["changed_nodes"] == ["node-local"]


def test_added_and_removed_entries_are_one_path_each_with_their_kind():
    candidate = copy.deepcopy(BASE)
    removed = candidate["models"].pop()
    candidate["models"].append({"id": "fresh", "providers": {"echo-cli": "echo"}})
    changes = {c["path"]: c["kind"] for c in report_of(candidate)["changes"]}
    assert changes == {f'models["{removed["id"]}"]': "removed", 'models["fresh"]': "added"}


def test_no_active_revision_reports_every_top_level_section_as_added():
    report = report_of(copy.deepcopy(BASE), old=None)
    assert {c["kind"] for c in report["changes"]} == {"added"}
    assert "models" in report["live_paths"]
    assert "edge" in report["restart_required_paths"]


def test_paths_render_ids_as_quoted_keys_and_round_trip():
    text = 'nodes["node-local"].providers["vllm-local"].capacity'
    assert render(parse_pattern(text)) == text
    odd = 'models["a \\"quoted\\" id"].usage_attribution'
    assert render(parse_pattern(odd)) == odd


def test_secrets_and_hashes_are_reported_as_changed_paths_never_as_values():
    """R-REF-6: a secret path is marked secret and carries neither value nor reference."""
    candidate = copy.deepcopy(BASE)
    old_hash = candidate["openai"]["principal_tokens"][0]["token_hash_sha256"]
    new_hash = "ab" * 32
    node_hash = "cd" * 32
    candidate["openai"]["principal_tokens"][0]["token_hash_sha256"] = new_hash
    candidate["nodes"][0]["token_hash_sha256"] = node_hash
    candidate["openai"]["bearer_token"] = {"env": "NEW_TOKEN_VARIABLE"}
    vllm = next(p for p in candidate["nodes"][0]["providers"] if p["id"] == "vllm-local")
    vllm["headers"] = {"Authorization": "Bearer sk-literal-header-value"}
    vllm["credential"] = {"file": "/run/secrets/vllm-key"}
    text = json.dumps(report_of(candidate))
    for value in (
        old_hash,
        new_hash,
        node_hash,
        "NEW_TOKEN_VARIABLE",
        "sk-literal-header-value",
        "/run/secrets/vllm-key",
    ):
        assert value not in text
    assert "openai.bearer_token" in text and '"changed"' in text
    changes = {c["path"]: c for c in report_of(candidate)["changes"]}
    assert changes["openai.bearer_token"] == {
        "path": "openai.bearer_token",
        "kind": "added",
        "class": "restart_required",
        "reason": changes["openai.bearer_token"]["reason"],
        "secret": True,
    }


def test_a_changed_value_is_shown_old_to_new_r_ref_4():
    """R-REF-4: an operator sees what an apply does: ``capacity`` 2 -> 5, not just the path."""
    candidate = copy.deepcopy(BASE)
    vllm = next(p for p in candidate["nodes"][0]["providers"] if p["id"] == "vllm-local")
    old_capacity = vllm["capacity"]
    vllm["capacity"] = old_capacity + 3
    change = next(c for c in report_of(candidate)["changes"] if c["path"].endswith(".capacity"))
    assert change["path"] == 'nodes["node-local"].providers["vllm-local"].capacity'
    assert (change["secret"], change["old"], change["new"]) == (
        False,
        old_capacity,
        vllm["capacity"],
    )
    assert values_text(change) == f"{old_capacity} → {vllm['capacity']}"


def test_an_added_entry_shows_its_value_with_every_secret_field_redacted_r_ref_6():
    """R-REF-6: inside a shown value (a whole added provider) credentials, header and env
    values, argv and URL user-info read ``[redacted]``; a removed one shows only ``old``."""
    candidate = copy.deepcopy(BASE)
    node = candidate["nodes"][0]
    node["providers"].append(
        {
            "id": "extra",
            "profile": "openai",
            "base_url": "http://user:sk-userinfo-7@10.0.0.9:8000/v1",
            "capacity": 3,
            "credential": {"env": "EXTRA_KEY_VARIABLE"},
            "headers": {"X-Api-Key": "sk-header-8"},
        }
    )
    removed = candidate["models"].pop()
    report = report_of(candidate)
    text = json.dumps(report)
    for secret in ("sk-userinfo-7", "EXTRA_KEY_VARIABLE", "sk-header-8"):
        assert secret not in text
    changes = {c["path"]: c for c in report["changes"]}
    added = changes['nodes["node-local"].providers["extra"]']
    assert "old" not in added and added["new"]["capacity"] == 3
    assert added["new"]["credential"] == REDACTED and added["new"]["headers"] == REDACTED
    assert added["new"]["base_url"] == f"http://{REDACTED}@10.0.0.9:8000/v1"
    gone = changes[f'models["{removed["id"]}"]']
    assert "new" not in gone and gone["old"]["id"] == removed["id"]
    assert values_text(gone).endswith("→ (none)")


def test_a_program_argv_is_never_shown_r_ref_6():
    """R-REF-6: argv may carry a key on a legacy CLI's command line: "changed" only."""
    candidate = copy.deepcopy(BASE)
    cli = next(p for p in candidate["nodes"][0]["providers"] if p.get("command"))
    cli["command"] = [*cli["command"], "--api-key", "sk-argv-9"]
    report = report_of(candidate)
    assert "sk-argv-9" not in json.dumps(report)
    change = next(c for c in report["changes"] if c["path"].endswith(".command"))
    assert change["secret"] is True and values_text(change) == "changed"


def test_error_messages_are_scrubbed_of_literal_secrets_written_in_the_candidate():
    document = {
        "openai": {"bearer_token": "sk-raw-token-123"},
        "admin": {"token": "ctl-raw-token-456"},
        "nodes": [{"providers": [{"headers": {"Authorization": "Bearer sk-hdr-9"}}]}],
    }
    report = error_report(
        "apply",
        "invalid",
        [
            ("openai.bearer_token", "got 'sk-raw-token-123', expected {env} or {file}"),
            ("nodes[0].providers[0].headers", "Bearer sk-hdr-9 is a literal credential"),
            ("admin.token", "got 'ctl-raw-token-456', expected {env} or {file}"),
        ],
        document,
    ).as_dict()
    text = json.dumps(report)
    assert "sk-raw-token-123" not in text and "sk-hdr-9" not in text
    assert "ctl-raw-token-456" not in text
    assert text.count(REDACTED) == 3
