"""Custom profile overlays, provider selection and legacy type aliases (R-PROF-1, 2, 3, 8, 9)."""

from __future__ import annotations

import pytest

from catalog.config import AuthSpec, load_snapshot
from tests.support.config import load_issues
from tests.support.config_examples import example_document


def _with_profiles(profiles: dict, selected: str | None = None) -> dict:
    document = example_document()
    document["protocol_profiles"] = profiles
    if selected is not None:
        provider = document["nodes"][0]["providers"][0]
        provider.pop("type")
        provider["profile"] = selected
    return document


LOCAL_VLLM = {
    "base": "openai",
    "driver": "openai_chat",
    "base_url": "http://127.0.0.1:8000/v1",
    "operations": {"chat_completions": "/chat/completions", "models": "/models"},
    "auth": {"type": "none"},
    "capabilities": ["models", "chat", "streaming"],
    "model_mapping": {"chat-model": "served-chat"},
}


def test_overlay_resolves_over_its_base_r_prof_1():
    """R-PROF-1: set fields replace the base's; unset ones are inherited."""
    snapshot = load_snapshot(_with_profiles({"local_vllm": LOCAL_VLLM}, "local_vllm"))
    spec = snapshot.providers["compat-a"]
    profile = spec.profile
    assert (profile.name, profile.base, profile.driver, profile.adapter) == (
        "local_vllm",
        "openai",
        "openai_chat",
        "openai_compat",
    )
    assert profile.auth.type == "none"
    assert profile.capabilities == {"models", "chat", "streaming"}
    assert dict(profile.operations) == {
        "chat_completions": "/chat/completions",
        "models": "/models",
    }
    assert profile.map_model("chat-model") == "served-chat"
    assert spec.base_url == "http://127.0.0.1:9001/v1"  # the provider's own base_url wins
    assert profile.resolve_operation_url("models") == "http://127.0.0.1:9001/v1/models"
    assert snapshot.profiles["local_vllm"].base_url == "http://127.0.0.1:8000/v1"
    assert snapshot.document["protocol_profiles"]["local_vllm"] == LOCAL_VLLM


def test_overlay_inherits_unset_fields_and_merges_mappings_r_prof_1():
    """R-PROF-1: base inheritance chains through custom profiles; auth merges by field."""
    profiles = {
        "root": {
            "base": "openai",
            "base_url": "http://10.0.0.1/v1",
            "model_mapping": {"a": "A"},
            "extensions": {"headers": {"x-a": "1", "x-b": "1"}},
        },
        "leaf": {
            "base": "root",
            "auth": {"scheme": "Token"},
            "model_mapping": {"b": "B"},
            "extensions": {"headers": {"x-b": "2"}},
        },
    }
    snapshot = load_snapshot(_with_profiles(profiles))
    leaf = snapshot.profiles["leaf"]
    assert leaf.base == "root" and leaf.base_url == "http://10.0.0.1/v1"
    assert leaf.auth == AuthSpec("bearer", "Authorization", "Token")
    assert dict(leaf.model_mapping) == {"a": "A", "b": "B"}
    assert leaf.extension_headers() == {"x-b": "2"}  # a key replaces the base's whole value
    assert leaf.operations == snapshot.profiles["openai"].operations
    assert leaf.capabilities == snapshot.profiles["openai"].capabilities


def test_overlay_without_base_needs_a_driver_r_prof_1():
    """R-PROF-1: a base-less profile declares its driver."""
    assert load_issues(_with_profiles({"p": {"base_url": "http://h/v1"}})) == [
        "protocol_profiles.p.driver: is required when the profile has no base"
    ]
    profile = {
        "driver": "openai_responses",
        "base_url": "http://h/v1",
        "operations": {"responses": "/responses"},
        "capabilities": ["responses"],
    }
    snapshot = load_snapshot(_with_profiles({"p": profile}))
    assert snapshot.profiles["p"].auth.type == "none"


def test_unknown_base_and_cycles_are_errors_naming_the_path_r_prof_1():
    """R-PROF-1: a base that does not exist, or an inheritance cycle, rejects the load."""
    assert load_issues(_with_profiles({"p": {"base": "nowhere"}})) == [
        "protocol_profiles.p.base: unknown profile 'nowhere'"
    ]
    assert load_issues(
        _with_profiles({"a": {"base": "b"}, "b": {"base": "c"}, "c": {"base": "a"}})
    ) == ["protocol_profiles.c.base: inheritance cycle: a -> b -> c -> a"]
    assert load_issues(_with_profiles({"self": {"base": "self"}})) == [
        "protocol_profiles.self.base: inheritance cycle: self -> self"
    ]


def test_custom_profile_may_not_shadow_a_builtin_r_prof_1():
    assert load_issues(_with_profiles({"glm": {"base": "openai"}})) == [
        "protocol_profiles.glm: shadows a built-in profile; use another name"
    ]


def test_unknown_profile_fields_and_capabilities_are_rejected_r_prof_1():
    """R-PROF-1/R-PROF-4: only the overlay fields, only the known capabilities."""
    profiles = {"p": {"base": "openai", "capabilities": ["chat", "teleport"], "timeout": 3}}
    assert load_issues(_with_profiles(profiles)) == [
        "protocol_profiles.p.capabilities[1]: must be one of 'messages', 'chat', 'responses', "
        "'streaming', 'tool_calling', 'count_tokens' or 'models'",
        "protocol_profiles.p.timeout: unknown key",
    ]


def test_operation_outside_the_driver_set_is_a_load_error_r_prof_3():
    """R-PROF-3: messages is not an openai_chat operation."""
    profiles = {
        "p": {
            "base": "openai",
            "operations": {"messages": "/messages", "models": "/m"},
            "capabilities": ["models"],
        }
    }
    assert load_issues(_with_profiles(profiles)) == [
        "protocol_profiles.p.operations.messages: not an operation of driver openai_chat "
        "(allowed: chat_completions, count_tokens, models, responses)"
    ]


def test_changing_the_driver_does_not_inherit_driver_specific_operations_r_prof_3():
    """R-PROF-3: over another driver, operations and capabilities must be declared anew."""
    profiles = {"claude_relay": {"base": "openai", "driver": "anthropic_messages"}}
    snapshot = load_snapshot(_with_profiles(profiles))
    relay = snapshot.profiles["claude_relay"]
    assert dict(relay.operations) == {} and relay.capabilities == frozenset()


def test_declared_capability_needs_its_operation_r_prof_4():
    """R-PROF-4: declaring responses without a responses operation is rejected."""
    profiles = {"p": {"base": "glm", "capabilities": ["chat", "responses"]}}
    assert load_issues(_with_profiles(profiles)) == [
        "protocol_profiles.p.capabilities: capability responses needs operation responses"
    ]


def test_provider_selects_exactly_one_of_profile_or_type_r_prof_2():
    """R-PROF-2: a provider names a catalog profile or a legacy type, never both or neither."""
    document = example_document()
    document["nodes"][0]["providers"][1]["type"] = "ollama"
    del document["nodes"][0]["providers"][2]["type"]
    assert load_issues(document) == [
        "nodes[0].providers[1].type: set exactly one of profile or type, not both",
        "nodes[0].providers[2].profile: is required (or a legacy type)",
    ]


def test_unknown_profile_selector_lists_the_catalog_r_prof_2():
    """R-PROF-2: a selector must name a built-in or custom profile."""
    document = _with_profiles({"mine": {"base": "openai"}})
    document["nodes"][0]["providers"][1]["profile"] = "olama"
    assert load_issues(document) == [
        "nodes[0].providers[1].profile: unknown profile 'olama' (known: anthropic, cli, glm, "
        "glm_coding, mine, ollama, openai, openai_responses)"
    ]


def test_provider_of_a_broken_custom_profile_is_not_reported_twice_r_prof_2():
    """R-PROF-2: the broken profile is the one error."""
    document = _with_profiles({"broken": {"base": "nowhere"}}, "broken")
    assert load_issues(document) == ["protocol_profiles.broken.base: unknown profile 'nowhere'"]


def test_source_document_keeps_the_selector_not_the_resolved_profile_r_prof_2():
    """R-PROF-2: the canonical document stays selector + catalog."""
    snapshot = load_snapshot(example_document())
    provider = snapshot.document["nodes"][0]["providers"][1]
    assert provider["profile"] == "ollama" and "operations" not in provider
    assert snapshot.document["protocol_profiles"] == {}


@pytest.mark.parametrize(
    ("type_name", "driver", "adapter", "label"),
    [
        ("openai_compat", "openai_chat", "openai_compat", "openai_compat"),
        ("seulgivibe_claude", "anthropic_messages", "openai_compat", "seulgivibe_claude"),
        ("seulgivibe_openai", "openai_chat", "openai_compat", "seulgivibe_openai"),
    ],
)
def test_legacy_http_types_normalize_to_openai_compat_drivers_r_prof_8_r_prof_9(
    type_name, driver, adapter, label
):
    """R-PROF-8/9: legacy types resolve to openai_compat with a tunnel driver; labels kept."""
    document = example_document()
    document["nodes"][0]["providers"][0]["type"] = type_name
    spec = load_snapshot(document).providers["compat-a"]
    assert (spec.profile.driver, spec.adapter, spec.label) == (driver, adapter, label)
    assert spec.profile.driver in {"openai_chat", "anthropic_messages", "openai_responses"}
    assert spec.profile.auth.type == "bearer"
    assert spec.base_url == "http://127.0.0.1:9001/v1"


def test_explicit_label_wins_over_the_seulgivibe_alias_r_prof_8():
    """R-PROF-8: the alias is the label only when no label is set."""
    document = example_document()
    document["nodes"][0]["providers"][0]["type"] = "seulgivibe_claude"
    document["nodes"][0]["providers"][0]["label"] = "claude-relay"
    assert load_snapshot(document).providers["compat-a"].label == "claude-relay"


def test_labels_default_to_the_profile_name():
    snapshot = load_snapshot(example_document())
    assert [snapshot.providers[p].label for p in ("compat-a", "ollama-a", "cli-a")] == [
        "openai_compat",
        "ollama",
        "cli",
    ]


def test_legacy_http_types_need_a_base_url_r_prof_9():
    """R-PROF-9: an OpenAI-compatible legacy provider has no default endpoint."""
    document = example_document()
    del document["nodes"][0]["providers"][0]["base_url"]
    assert load_issues(document) == [
        "nodes[0].providers[0].base_url: is required for type openai_compat"
    ]


def test_legacy_cli_and_ollama_types_match_their_builtins_r_prof_2():
    """R-PROF-2: type cli / ollama normalize to the built-in profiles."""
    document = example_document()
    document["nodes"][0]["providers"][1] = {
        "id": "ollama-a",
        "type": "ollama",
        "base_url": "http://10.1.1.1:11434",
    }
    snapshot = load_snapshot(document)
    assert snapshot.providers["ollama-a"].profile.name == "ollama"
    assert snapshot.providers["ollama-a"].profile.resolve_operation_url("chat") == (
        "http://10.1.1.1:11434/api/chat"
    )
    assert snapshot.providers["cli-a"].profile == snapshot.profiles["cli"]


def test_unknown_legacy_type_is_rejected():
    document = example_document()
    document["nodes"][0]["providers"][0]["type"] = "vllm"
    (message,) = load_issues(document)
    assert message.startswith("nodes[0].providers[0].type: must be one of 'openai_compat'")


def test_cli_provider_settings():
    """A cli provider needs a command; HTTP-only keys are rejected on it and vice versa."""
    document = example_document()
    cli = document["nodes"][0]["providers"][2]
    del cli["command"]
    cli["base_url"] = "http://h"
    cli["credential"] = {"env": "K"}
    document["nodes"][0]["providers"][0]["command"] = ["x"]
    document["nodes"][0]["providers"][0]["run_timeout_ms"] = 5
    assert load_issues(document) == [
        "nodes[0].providers[0].command: is only for cli providers",
        "nodes[0].providers[0].run_timeout_ms: is only for cli providers",
        "nodes[0].providers[2].base_url: is not used by a cli provider",
        "nodes[0].providers[2].command: is required for a cli provider",
        "nodes[0].providers[2].credential: is not used by a cli provider",
    ]


def test_cli_provider_timeouts_and_env():
    document = example_document()
    cli = document["nodes"][0]["providers"][2]
    cli.update(run_timeout_ms=1000, idle_timeout_ms=500, env={"TOKEN": {"env": "CLI_TOKEN"}})
    spec = load_snapshot(document).providers["cli-a"]
    assert spec.command == ("cat",)
    assert (spec.run_timeout_ms, spec.idle_timeout_ms, spec.first_byte_timeout_ms) == (
        1000,
        500,
        60000,
    )
    assert spec.env["TOKEN"].env == "CLI_TOKEN"


def test_profile_without_base_url_needs_one_on_the_provider():
    profiles = {
        "bare": {
            "driver": "openai_chat",
            "operations": {"chat_completions": "/c"},
            "capabilities": ["chat"],
            "auth": {"type": "bearer"},
        }
    }
    document = _with_profiles(profiles, "bare")
    del document["nodes"][0]["providers"][0]["base_url"]
    assert load_issues(document) == [
        "nodes[0].providers[0].base_url: is required: profile bare has none"
    ]


def test_credential_on_a_profile_without_auth_is_rejected():
    document = example_document()
    document["nodes"][0]["providers"][1]["credential"] = {"env": "OLLAMA_KEY"}
    assert load_issues(document) == [
        "nodes[0].providers[1].credential: profile ollama sends no credential (auth type none)"
    ]


def test_r_xlate_3_unknown_or_credential_extensions_are_refused_at_load():
    """R-XLATE-3: an extension is applied or refused at load, never ignored."""
    profiles = {
        "p": {"base": "openai", "extensions": {"retries": 3}},
        "q": {"base": "anthropic", "extensions": {"headers": {"x-api-key": "k", "x-ok": 1}}},
    }
    assert load_issues(_with_profiles(profiles)) == [
        "protocol_profiles.p.extensions.retries: unknown extension (known: headers, thinking)",
        "protocol_profiles.q.extensions.headers.x-api-key: carries a credential; "
        "use a provider credential",
        "protocol_profiles.q.extensions.headers.x-ok: must be an HTTP header name with a "
        "string value",
    ]


def test_profile_base_url_and_extensions_are_validated():
    profiles = {"p": {"base": "openai", "base_url": "ftp://h/v1", "extensions": {"when": {1, 2}}}}
    messages = load_issues(_with_profiles(profiles))
    assert messages == [
        "protocol_profiles.p.base_url: must be an http:// or https:// URL with a host",
        "protocol_profiles.p.extensions: must hold only JSON values "
        "(strings, numbers, booleans, null, lists, mappings)",
    ]


def test_r_xlate_4_a_thinking_switch_is_applied_or_refused_at_load():
    """R-XLATE-4: ``extensions.thinking`` names a known switch, on a Chat profile only; the
    profile then carries it to translation."""
    profiles = {
        "qwen": {"base": "openai", "extensions": {"thinking": "enable_thinking"}},
        "bad": {"base": "openai", "extensions": {"thinking": "always"}},
        "claude": {"base": "anthropic", "extensions": {"thinking": "glm"}},
    }
    assert load_issues(_with_profiles(profiles)) == [
        "protocol_profiles.bad.extensions.thinking: must be one of reasoning_effort, glm, "
        "enable_thinking, none",
        "protocol_profiles.claude.extensions.thinking: applies to an openai_chat profile only "
        "(translation to Chat)",
    ]
    document = _with_profiles({"qwen": profiles["qwen"]})
    document["nodes"][0]["providers"][0]["profile"] = "qwen"
    document["nodes"][0]["providers"][0].pop("type", None)
    snapshot = load_snapshot(document)
    spec = snapshot.providers["compat-a"]
    assert spec.profile.thinking() == "enable_thinking"


def test_r_xlate_5_translate_takes_an_object_that_says_what_to_do_with_drops():
    document = example_document()
    document["models"][0]["translate"] = {"unsupported": "refuse"}
    document["models"][1]["translate"] = {}
    snapshot = load_snapshot(document)
    chat, echo = snapshot.models["chat-model"], snapshot.models["echo"]
    assert (chat.translate, chat.refuse_dropped) == (True, True)
    assert (echo.translate, echo.refuse_dropped) == (True, False)
    document["models"][0]["translate"] = {"unsupported": "ignore", "other": 1}
    issues = load_issues(document)
    assert any(i.startswith("models[0].translate") for i in issues), issues
