"""Config errors: every issue at once, named by path, sorted, nothing half-loaded (R-CFG-5)."""

from __future__ import annotations

import pytest

from catalog.config import ConfigError, ConfigIssue, load_snapshot
from tests.support.config import load_issues
from tests.support.config_examples import example_document


def test_issue_renders_as_path_colon_message():
    issue = ConfigIssue("nodes[0].providers[1].capacity", "must be >= 1")
    assert str(issue) == "nodes[0].providers[1].capacity: must be >= 1"


def test_issue_is_frozen():
    issue = ConfigIssue("a", "b")
    with pytest.raises(AttributeError):
        issue.path = "c"  # type: ignore[misc]


def test_error_sorts_issues_by_path_naturally_and_joins_them_by_line():
    error = ConfigError(
        [
            ConfigIssue("nodes[10].id", "x"),
            ConfigIssue("nodes[2].id", "y"),
            ConfigIssue("<root>", "z"),
            ConfigIssue("admin.listen", "w"),
        ]
    )
    assert [i.path for i in error.issues] == [
        "<root>",
        "admin.listen",
        "nodes[2].id",
        "nodes[10].id",
    ]
    assert str(error) == "<root>: z\nadmin.listen: w\nnodes[2].id: y\nnodes[10].id: x"


def test_error_sort_is_stable_and_drops_exact_repeats():
    first, second = ConfigIssue("a.b", "first"), ConfigIssue("a.b", "second")
    error = ConfigError([first, second, first])
    assert error.issues == (first, second)


def test_every_issue_is_reported_at_once_with_its_path_r_cfg_5():
    """R-CFG-5: independent problems across sections come back in one error."""
    document = example_document()
    document["admin"]["listen"] = "0.0.0.0:7701"
    document["nodes"][0]["providers"][0]["capacity"] = 0
    document["nodes"][0]["providers"][1]["capcity"] = 3
    document["models"][1]["providers"]["ghost"] = "x"
    document["openai"]["long_context_threshold_tokens"] = -1
    assert load_issues(document) == [
        "admin.listen: must be a loopback address (127.0.0.0/8, ::1 or localhost)",
        "models[1].providers.ghost: unknown provider id",
        "nodes[0].providers[0].capacity: must be >= 1",
        "nodes[0].providers[1].capcity: unknown key",
        "openai.long_context_threshold_tokens: must be > 0",
    ]


def test_cross_field_rules_still_run_beside_a_broken_item_r_cfg_5():
    """R-CFG-5: a provider with a bad field still counts as existing for model references."""
    document = example_document()
    document["nodes"][0]["providers"][0]["priority"] = "high"
    messages = load_issues(document)
    assert messages == ["nodes[0].providers[0].priority: must be an integer"]


def test_unknown_keys_name_the_key_at_every_level():
    document = example_document()
    document["extra_root"] = 1
    document["edge"]["lisen"] = "127.0.0.1:1"
    document["openai"]["provider_auth"] = {"enabeld": True}
    document["nodes"][0]["aliass"] = "x"
    document["models"][0]["usage"] = "provider"
    assert load_issues(document) == [
        "edge.lisen: unknown key",
        "extra_root: unknown key",
        "models[0].usage: unknown key",
        "nodes[0].aliass: unknown key",
        "openai.provider_auth.enabeld: unknown key",
    ]


def test_wrong_types_are_named_not_coerced():
    document = example_document()
    document["nodes"][0]["providers"][0]["capacity"] = "4"
    document["nodes"][0]["providers"][1]["enabled"] = "yes"
    document["nodes"] = document["nodes"] + [
        {"id": "n2", "token_hash_sha256": "0" * 64, "providers": {}}
    ]
    document["models"] = {"not": "a list"}
    assert load_issues(document) == [
        "models: must be a list",
        "nodes[0].providers[0].capacity: must be an integer",
        "nodes[0].providers[1].enabled: must be true or false",
        "nodes[1].providers: must be a list",
    ]


def test_required_keys_are_named():
    document = example_document()
    del document["nodes"][0]["token_hash_sha256"]
    del document["nodes"][0]["providers"][2]["id"]
    del document["models"][0]["providers"]
    assert load_issues(document) == [
        "models[0].providers: is required",
        "models[1].providers.cli-a: unknown provider id",  # its provider has no id any more
        "nodes[0].providers[2].id: is required",
        "nodes[0].token_hash_sha256: is required",
    ]


def test_a_rejected_document_is_left_untouched():
    """R-CFG-5: loading never rewrites its input, even while promoting legacy keys."""
    document = example_document()
    document["nodes"][0]["providers"][0]["max_queue"] = 4
    document["nodes"][0]["providers"][1]["max_queue"] = 5
    del document["provider_pool"]
    before = example_document()
    before["nodes"][0]["providers"][0]["max_queue"] = 4
    before["nodes"][0]["providers"][1]["max_queue"] = 5
    del before["provider_pool"]
    with pytest.raises(ConfigError):
        load_snapshot(document)
    assert document == before
