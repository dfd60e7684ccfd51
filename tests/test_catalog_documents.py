"""Catalog tables <-> config document: lossless round trip, all-or-nothing import (R-CFG-5)."""

from __future__ import annotations

import copy

import pytest

from catalog.config import ConfigError, load_snapshot, parse_text
from catalog.documents import (
    catalog_is_empty,
    catalog_to_document,
    document_to_catalog,
    validated_change,
)
from catalog.models import EdgeSettings, ModelGroup, ModelProvider, Node, PrincipalToken, Provider
from tests.support.processes import EDGE_YAML

pytestmark = pytest.mark.django_db


def example() -> dict:
    return parse_text(EDGE_YAML.read_text())


def rich_example() -> dict:
    """The example plus the optional keys an operator may write (adapter settings, TLS, GLM)."""
    document = example()
    document["edge"]["tls"] = {"cert_file": "/etc/iop/edge.crt", "key_file": "/etc/iop/edge.key"}
    providers = document["nodes"][0]["providers"]
    providers[0]["label"] = "Local Ollama"
    providers[1]["headers"] = {"X-Team": "research"}
    providers[1]["first_byte_timeout_ms"] = 5000
    providers.append(
        {
            "id": "glm-general",
            "profile": "glm",
            "credential": {"env": "ZAI_API_KEY"},
            "capacity": 4,
            "priority": 20,
            "enabled": False,
        }
    )
    document["nodes"].append(
        {
            "id": "node-b",
            "token_hash_sha256": "b" * 64,
            "providers": [{"id": "glm-coding", "profile": "glm_coding", "capacity": 2}],
        }
    )
    document["models"].insert(
        0, {"id": "glm-4.6", "providers": {"glm-general": "glm-4.6", "glm-coding": "glm-4.6"}}
    )
    return document


def managed_example() -> dict:
    """The example in managed credential mode (R-AUTH-3): TLS everywhere, no legacy auth."""
    document = example()
    document["edge"]["tls"] = {"cert_file": "/etc/iop/edge.crt", "key_file": "/etc/iop/edge.key"}
    document["openai"]["tls"] = {"cert_file": "/etc/iop/api.crt", "key_file": "/etc/iop/api.key"}
    for legacy in ("bearer_token", "principal_tokens", "provider_auth"):
        document["openai"].pop(legacy, None)
    document["credential_plane"] = {
        "enabled": True,
        "issuer": {"key_id": "issuer-1", "private_key_file": "/etc/iop/issuer.key"},
        "keyring_file": "/etc/iop/keyring.json",
    }
    for node in document["nodes"]:
        node["credential_recipient"] = {"key_id": "n-1", "public_key_file": "/etc/iop/n.pub"}
    return document


def test_importing_the_shipped_edge_yaml_exports_a_document_that_loads_identically():
    original = example()
    document_to_catalog(original)
    assert load_snapshot(catalog_to_document()) == load_snapshot(original)


def test_optional_keys_and_several_nodes_survive_the_round_trip():
    original = rich_example()
    document_to_catalog(original)
    exported = catalog_to_document()
    assert load_snapshot(exported) == load_snapshot(original)
    assert exported["edge"]["tls"] == original["edge"]["tls"]
    assert exported["nodes"][0]["providers"][1]["headers"] == {"X-Team": "research"}


def test_principal_token_policy_survives_the_round_trip_in_its_columns():
    """R-PRIN-1..3: models and limits are catalog columns, exported as written."""
    original = example()
    policy = {"models": ["echo"], "max_in_flight": 2, "rpm": 60, "tpm": 5000, "max_queued": 4}
    original["openai"]["principal_tokens"][0].update(policy)
    document_to_catalog(original)
    token = PrincipalToken.objects.get(token_ref="app-notebook")
    assert (token.model_groups, token.max_in_flight, token.rpm, token.tpm, token.max_queued) == (
        ["echo"],
        2,
        60,
        5000,
        4,
    )
    assert token.settings == {}
    exported = catalog_to_document()
    entry = exported["openai"]["principal_tokens"][0]
    assert {key: entry[key] for key in policy} == policy
    assert load_snapshot(exported) == load_snapshot(original)


def test_budgets_and_fallbacks_survive_the_round_trip_in_their_columns():
    """R-BUD-1, R-FALL-1: a principal's budget and a group's fallbacks are catalog columns."""
    original = example()
    budget = {"tokens": 5000, "period": "month"}
    original["openai"]["principal_tokens"][0]["budget"] = budget
    group = original["models"][0]
    group["fallbacks"] = [m["id"] for m in original["models"][1:2]]
    document_to_catalog(original)
    token = PrincipalToken.objects.get(token_ref="app-notebook")
    assert (token.budget, token.settings) == (budget, {})
    row = ModelGroup.objects.get(key=group["id"])
    assert row.fallbacks == group["fallbacks"] and "fallbacks" not in row.settings
    exported = catalog_to_document()
    assert exported["openai"]["principal_tokens"][0]["budget"] == budget
    assert exported["models"][0]["fallbacks"] == group["fallbacks"]
    assert load_snapshot(exported) == load_snapshot(original)


def test_principals_and_the_new_limits_survive_the_round_trip():
    """R-MGD-13, R-LIM-2, R-LIM-5: ``principals:``, a token's ``max_pending_bodies`` and a
    group's ``max_output_tokens`` are kept and exported as written."""
    original = example()
    principals = [{"id": "team-research", "rpm": 60, "budget": {"tokens": 9, "period": "day"}}]
    original["principals"] = principals
    original["openai"]["principal_tokens"][0]["max_pending_bodies"] = 3
    original["models"][0]["max_output_tokens"] = 512
    document_to_catalog(original)
    exported = catalog_to_document()
    assert exported["principals"] == principals
    assert exported["openai"]["principal_tokens"][0]["max_pending_bodies"] == 3
    assert exported["models"][0]["max_output_tokens"] == 512
    assert load_snapshot(exported) == load_snapshot(original)


def test_prices_the_currency_and_money_budgets_survive_the_round_trip():
    """R-COST-1, R-COST-3: prices sit in their columns, the currency and a budget in money
    are exported as written and load to the same snapshot (exact decimals)."""
    original = example()
    group_price = {"input": 0.15, "output": 0.6, "cached_input": 0.075}
    original["models"][0]["price"] = group_price
    first = original["nodes"][0]["providers"][0]
    first["price"] = {"input": "3", "output": 15}
    original["metering"] = {"currency": "EUR"}
    original["principals"] = [
        {"id": "team-research", "budget": {"amount": 25.5, "period": "month"}}
    ]
    document_to_catalog(original)
    assert ModelGroup.objects.get(key=original["models"][0]["id"]).price == group_price
    assert Provider.objects.get(key=first["id"]).price == {"input": 3, "output": 15}
    exported = catalog_to_document()
    assert exported["metering"] == {"currency": "EUR"}
    assert exported["principals"] == original["principals"]
    assert load_snapshot(exported) == load_snapshot(original)


def test_managed_mode_sections_survive_the_round_trip():
    original = managed_example()
    document_to_catalog(original)
    exported = catalog_to_document()
    assert load_snapshot(exported) == load_snapshot(original)
    assert exported["credential_plane"]["keyring_file"] == "/etc/iop/keyring.json"
    assert exported["nodes"][0]["credential_recipient"]["key_id"] == "n-1"
    assert EdgeSettings.objects.get().credential_plane_enabled is True


def test_nested_mappings_keep_their_key_order():
    """Header and operation order is part of the document; jsonb would sort it."""
    original = rich_example()
    original["nodes"][0]["providers"][1]["headers"] = {"X-Zeta": "1", "X-Alpha": "2"}
    operations = {"models": "/models", "chat_completions": "/chat/completions"}
    original["protocol_profiles"]["local_vllm"]["operations"] = operations
    document_to_catalog(original)
    exported = catalog_to_document()
    assert list(exported["nodes"][0]["providers"][1]["headers"]) == ["X-Zeta", "X-Alpha"]
    assert list(exported["protocol_profiles"]["local_vllm"]["operations"]) == list(operations)
    assert load_snapshot(exported) == load_snapshot(original)


def test_round_trip_keeps_document_order_of_every_list_and_mapping():
    original = rich_example()
    document_to_catalog(original)
    exported = catalog_to_document()
    assert [n["id"] for n in exported["nodes"]] == [n["id"] for n in original["nodes"]]
    assert [p["id"] for p in exported["nodes"][0]["providers"]] == [
        p["id"] for p in original["nodes"][0]["providers"]
    ]
    assert [m["id"] for m in exported["models"]] == [m["id"] for m in original["models"]]
    assert [list(m["providers"]) for m in exported["models"]] == [
        list(m["providers"]) for m in original["models"]
    ]
    assert list(exported["protocol_profiles"]) == list(original["protocol_profiles"])
    tokens = exported["openai"]["principal_tokens"]
    assert [t["token_ref"] for t in tokens] == ["app-notebook", "app-ci"]


def test_import_fills_the_structured_columns():
    document_to_catalog(example())
    vllm = Provider.objects.get(key="vllm-local")
    assert (vllm.node.key, vllm.profile, vllm.capacity, vllm.long_context_capacity) == (
        "node-local",
        "local_vllm",
        4,
        1,
    )
    assert ModelProvider.objects.get(provider=vllm).served_model == "Qwen/Qwen2.5-7B-Instruct"
    settings = EdgeSettings.objects.get()
    assert settings.long_context_threshold_tokens == 100000
    assert settings.max_request_bytes == 8388608


def test_invalid_document_is_rejected_with_every_path_and_writes_nothing():
    document_to_catalog(example())
    before = catalog_to_document()
    broken = copy.deepcopy(example())
    broken["nodes"][0]["providers"][0]["capacity"] = 0
    broken["models"][0]["providers"]["no-such-provider"] = "x"
    broken["openai"]["long_context_threshold_tokens"] = 0
    with pytest.raises(ConfigError) as caught:
        document_to_catalog(broken)
    paths = {issue.path for issue in caught.value.issues}
    assert "nodes[0].providers[0].capacity" in paths
    assert "openai.long_context_threshold_tokens" in paths
    assert any(path.startswith("models[0].providers") for path in paths)
    assert catalog_to_document() == before


def test_import_replaces_the_whole_previous_catalog():
    document_to_catalog(rich_example())
    document_to_catalog(example())
    assert not Node.objects.filter(key="node-b").exists()
    assert not ModelGroup.objects.filter(key="glm-4.6").exists()
    assert load_snapshot(catalog_to_document()) == load_snapshot(example())


def test_catalog_is_empty_until_something_is_imported():
    assert catalog_is_empty()
    document_to_catalog(example())
    assert not catalog_is_empty()


def test_validated_change_rolls_back_an_edit_that_breaks_the_catalog():
    document_to_catalog(example())
    with pytest.raises(ConfigError) as caught, validated_change():
        Provider.objects.filter(key="vllm-local").update(long_context_capacity=99)
        PrincipalToken.objects.filter(token_ref="app-ci").delete()
    assert [issue.path for issue in caught.value.issues] == [
        "nodes[0].providers[1].long_context_capacity"
    ]
    assert Provider.objects.get(key="vllm-local").long_context_capacity == 1
    assert PrincipalToken.objects.filter(token_ref="app-ci").exists()


def test_new_rows_without_an_order_go_last_in_the_document():
    document_to_catalog(example())
    node = Node.objects.get(key="node-local")
    Provider.objects.create(node=node, key="late", legacy_type="cli")
    assert catalog_to_document()["nodes"][0]["providers"][-1]["id"] == "late"
