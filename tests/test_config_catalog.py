"""Catalog rules: model groups, providers, references, budgets (R-CFG-1..5, 8..11, 13)."""

from __future__ import annotations

import asyncio

import pytest

from catalog.config import load_snapshot
from pool.engine import ProviderPool
from pool.policy import policy_from_snapshot
from tests.support.config import load_issues
from tests.support.config_examples import EXAMPLE_NODE_TOKEN_HASH, example_document


def _provider(document, index: int) -> dict:
    return document["nodes"][0]["providers"][index]


def _second_node(*providers: dict) -> dict:
    return {"id": "node-b", "token_hash_sha256": "a" * 64, "providers": list(providers)}


def test_model_id_is_the_external_model_key_r_cfg_1():
    """R-CFG-1: models[].id keys the model groups, in document order."""
    snapshot = load_snapshot(example_document())
    assert list(snapshot.models) == ["chat-model", "echo"]
    assert snapshot.models["chat-model"].id == "chat-model"


def test_model_maps_provider_to_served_model_in_document_order_r_cfg_2():
    """R-CFG-2: models[].providers maps provider id -> served model name."""
    document = example_document()
    document["models"][0]["providers"] = {"ollama-a": "llama3", "compat-a": "served-chat"}
    group = load_snapshot(document).models["chat-model"]
    assert list(group.providers.items()) == [("ollama-a", "llama3"), ("compat-a", "served-chat")]


def test_provider_ids_are_unique_across_all_nodes_r_cfg_3():
    """R-CFG-3: a provider id may not repeat, even on another Node."""
    document = example_document()
    document["nodes"].append(_second_node({"id": "ollama-a", "profile": "ollama"}))
    assert load_issues(document) == [
        "nodes[1].providers[0].id: duplicate provider id 'ollama-a' "
        "(first at nodes[0].providers[1])"
    ]


def test_node_ids_are_unique_r_cfg_3():
    """R-CFG-3: two Nodes cannot share an id."""
    document = example_document()
    document["nodes"].append({"id": "node-a", "token_hash_sha256": "b" * 64})
    assert load_issues(document) == ["nodes[1].id: duplicate node id 'node-a' (first at nodes[0])"]


def test_node_catalog_is_exposed_per_node_and_by_provider_id_r_cfg_3():
    """R-CFG-3: each Node's providers keep their order and know their Node."""
    document = example_document()
    document["nodes"].append(_second_node({"id": "ollama-b", "profile": "ollama"}))
    snapshot = load_snapshot(document)
    assert [p.id for p in snapshot.nodes[0].providers] == ["compat-a", "ollama-a", "cli-a"]
    assert snapshot.providers["ollama-b"].node_id == "node-b"
    assert snapshot.node("node-b") is snapshot.nodes[1]
    assert snapshot.node("missing") is None
    assert snapshot.nodes[0].token_hash_sha256 == EXAMPLE_NODE_TOKEN_HASH


def test_model_ids_are_unique():
    document = example_document()
    document["models"].append({"id": "echo", "providers": {"cli-a": "echo"}})
    assert load_issues(document) == ["models[2].id: duplicate model id 'echo' (first at models[1])"]


def test_model_id_may_carry_slashes_and_colons_but_no_whitespace():
    document = example_document()
    document["models"][1]["id"] = "org/model:7b"
    assert "org/model:7b" in load_snapshot(document).models
    document["models"][1]["id"] = "two words"
    assert load_issues(document) == ["models[1].id: must not contain whitespace"]


def test_usage_attribution_defaults_to_provider_r_cfg_4():
    """R-CFG-4: omitted usage_attribution means provider."""
    snapshot = load_snapshot(example_document())
    assert snapshot.models["echo"].usage_attribution == "provider"
    assert snapshot.document["models"][1]["usage_attribution"] == "provider"


def test_usage_attribution_model_group_is_an_opt_in_r_cfg_4():
    """R-CFG-4: model_group is accepted when written explicitly."""
    document = example_document()
    document["models"][0]["usage_attribution"] = "model_group"
    assert load_snapshot(document).models["chat-model"].usage_attribution == "model_group"


@pytest.mark.parametrize("value", ["team", "", None, 1])
def test_other_usage_attribution_values_are_rejected_r_cfg_4(value):
    """R-CFG-4: anything but provider | model_group is a load error."""
    document = example_document()
    document["models"][0]["usage_attribution"] = value
    (message,) = load_issues(document)
    assert message.startswith("models[0].usage_attribution: must be")


def test_every_model_provider_must_exist_r_cfg_5():
    """R-CFG-5: a model that names an unknown provider is rejected, at that key."""
    document = example_document()
    document["models"][0]["providers"]["vllm-local"] = "qwen"
    assert load_issues(document) == ["models[0].providers.vllm-local: unknown provider id"]


def test_a_model_needs_at_least_one_provider_and_served_names_are_not_empty_r_cfg_5():
    """R-CFG-5: served-model membership: every group maps >= 1 provider to a non-empty name."""
    document = example_document()
    document["models"][0]["providers"] = {}
    document["models"][1]["providers"] = {"cli-a": ""}
    assert load_issues(document) == [
        "models[0].providers: must not be empty",
        "models[1].providers.cli-a: must not be empty",
    ]


def test_served_model_must_agree_with_profile_model_mapping_r_cfg_5():
    """R-CFG-5/R-PROF-5: a served name contradicting the profile's model_mapping is rejected."""
    document = example_document()
    document["protocol_profiles"] = {
        "mapped": {
            "base": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "model_mapping": {"chat-model": "upstream-a"},
        },
    }
    _provider(document, 0).pop("type")
    _provider(document, 0)["profile"] = "mapped"
    _provider(document, 0).pop("base_url")
    assert load_issues(document) == [
        "models[0].providers.compat-a: profile mapped maps 'chat-model' to 'upstream-a', "
        "not 'served-chat'"
    ]
    document["models"][0]["providers"]["compat-a"] = "upstream-a"
    assert load_snapshot(document).models["chat-model"].providers["compat-a"] == "upstream-a"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("capacity", 0, "capacity: must be >= 1"),
        ("capacity", -3, "capacity: must be >= 1"),
        ("long_context_capacity", -1, "long_context_capacity: must be >= 0"),
        ("context_window_tokens", 0, "context_window_tokens: must be >= 1"),
        ("priority", True, "priority: must be an integer"),
        ("priority", 1.5, "priority: must be an integer"),
        ("first_byte_timeout_ms", 0, "first_byte_timeout_ms: must be >= 1"),
        ("idle_timeout_ms", 0, "idle_timeout_ms: must be >= 1"),
        ("concurrency", -1, "concurrency: must be >= 0"),
    ],
)
def test_numeric_bounds_name_the_field_r_cfg_5(key, value, message):
    """R-CFG-5: each provider number is bounded and the error names its path."""
    document = example_document()
    _provider(document, 1)[key] = value
    assert load_issues(document) == [f"nodes[0].providers[1].{message}"]


def test_provider_defaults():
    document = example_document()
    document["nodes"][0]["providers"][1] = {"id": "ollama-a", "profile": "ollama"}
    spec = load_snapshot(document).providers["ollama-a"]
    assert (spec.capacity, spec.long_context_capacity, spec.priority, spec.enabled) == (
        1,
        0,
        100,
        True,
    )
    assert (spec.first_byte_timeout_ms, spec.idle_timeout_ms, spec.run_timeout_ms) == (
        60000,
        120000,
        None,
    )
    assert spec.context_window_tokens is None and spec.concurrency is None


def test_long_context_capacity_is_bounded_by_capacity_r_cfg_8():
    """R-CFG-8: 0 <= long_context_capacity <= capacity."""
    document = example_document()
    _provider(document, 0)["long_context_capacity"] = 3  # capacity is 2
    assert load_issues(document) == [
        "nodes[0].providers[0].long_context_capacity: must be <= capacity (2)"
    ]
    _provider(document, 0)["long_context_capacity"] = 2
    assert load_snapshot(document).providers["compat-a"].long_context_capacity == 2


def test_long_slots_need_a_context_window_of_at_least_the_threshold_r_cfg_8():
    """R-CFG-8: the long-context budget needs context_window_tokens >= the threshold."""
    document = example_document()
    _provider(document, 0)["context_window_tokens"] = 99999
    assert load_issues(document) == [
        "nodes[0].providers[0].context_window_tokens: must be >= long_context_threshold_tokens "
        "(100000) when long_context_capacity > 0"
    ]
    del _provider(document, 0)["context_window_tokens"]
    assert load_issues(document) == [
        "nodes[0].providers[0].context_window_tokens: is required when long_context_capacity > 0"
    ]


def test_total_context_tokens_is_window_times_long_slots_r_cfg_8():
    """R-CFG-8: total_context_tokens = context_window_tokens * long_context_capacity."""
    document = example_document()
    _provider(document, 0)["long_context_capacity"] = 2
    snapshot = load_snapshot(document)
    assert snapshot.providers["compat-a"].total_context_tokens == 131072 * 2
    assert snapshot.providers["ollama-a"].total_context_tokens == 0


def test_capacity_belongs_to_the_provider_shared_by_model_aliases_r_cfg_8():
    """R-CFG-8: two model groups mapping one provider see the same provider resource."""
    document = example_document()
    document["models"].append({"id": "alias", "providers": {"compat-a": "served-chat"}})
    snapshot = load_snapshot(document)
    assert dict(snapshot.served_models("compat-a")) == {
        "chat-model": "served-chat",
        "alias": "served-chat",
    }
    assert snapshot.providers["compat-a"].capacity == 2
    assert snapshot.served_models("nobody") == {}


def test_disabled_provider_stays_in_the_catalog_r_cfg_9():
    """R-CFG-9: enabled=false is a pool flag; the provider and its mappings still load."""
    document = example_document()
    _provider(document, 0)["enabled"] = False
    snapshot = load_snapshot(document)
    assert snapshot.providers["compat-a"].enabled is False
    assert "compat-a" in snapshot.models["chat-model"].providers


def test_mixed_and_ollama_only_groups_load_r_cfg_10():
    """R-CFG-10: OpenAI-compatible + Ollama + CLI in one group, and an Ollama-only group."""
    document = example_document()
    document["models"][0]["providers"]["cli-a"] = "echo"
    document["models"].append({"id": "local-only", "providers": {"ollama-a": "qwen2.5:7b"}})
    snapshot = load_snapshot(document)
    kinds = {snapshot.providers[p].adapter for p in snapshot.models["chat-model"].providers}
    assert kinds == {"openai_compat", "ollama", "cli"}
    assert list(snapshot.models["local-only"].providers) == ["ollama-a"]


def test_what_a_provider_serves_is_read_from_the_models_mapping_r_cfg_11():
    """R-CFG-11: a provider's served models are the models[] entries naming it."""
    snapshot = load_snapshot(example_document())
    assert dict(snapshot.served_models("ollama-a")) == {"chat-model": "llama3"}
    assert dict(snapshot.served_models("cli-a")) == {"echo": "echo"}


async def test_concurrency_is_metadata_not_an_admission_limit_r_cfg_13():
    """R-CFG-13: concurrency, on a provider or as the legacy node-level key, loads as metadata
    and neither bounds nor changes admission: every slot of capacity is still leased."""
    document = example_document()
    document["nodes"][0]["concurrency"] = 1
    _provider(document, 0)["concurrency"] = 1
    _provider(document, 1)["concurrency"] = 64  # above capacity: still fine
    snapshot = load_snapshot(document)
    assert snapshot.nodes[0].concurrency == 1
    assert (
        snapshot.providers["compat-a"].capacity,
        snapshot.providers["compat-a"].concurrency,
    ) == (2, 1)
    assert (
        snapshot.providers["ollama-a"].capacity,
        snapshot.providers["ollama-a"].concurrency,
    ) == (1, 64)
    pool = ProviderPool(policy_from_snapshot(snapshot))
    pool.node_ready("node-a", 1)
    leases = [await asyncio.wait_for(pool.acquire("chat-model"), 5) for _ in range(3)]
    assert sorted(lease.provider_id for lease in leases) == ["compat-a", "compat-a", "ollama-a"]
    leases.append(await asyncio.wait_for(pool.acquire("echo"), 5))
    for lease in leases:
        pool.release(lease)
    assert pool.idle()


def test_a_negative_node_concurrency_is_refused_naming_the_path_r_cfg_13():
    document = example_document()
    document["nodes"][0]["concurrency"] = -1
    assert [m.split(":")[0] for m in load_issues(document)] == ["nodes[0].concurrency"]


@pytest.mark.parametrize("bad_id", ["", "has space", "-leading", "a/b"])
def test_provider_and_node_ids_are_plain_identifiers(bad_id):
    document = example_document()
    document["nodes"][0]["id"] = bad_id
    _provider(document, 1)["id"] = bad_id
    messages = load_issues(document)
    assert [m.split(":")[0] for m in messages] == [
        "models[0].providers.ollama-a",
        "nodes[0].id",
        "nodes[0].providers[1].id",
    ]


def test_node_token_hash_must_be_lowercase_sha256_hex():
    document = example_document()
    document["nodes"][0]["token_hash_sha256"] = EXAMPLE_NODE_TOKEN_HASH.upper()
    assert load_issues(document) == [
        "nodes[0].token_hash_sha256: must be 64 lowercase hex characters (a sha256 digest)"
    ]
