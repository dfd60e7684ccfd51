"""Built-in protocol profiles and the runtime profile methods (R-PROF-3..7)."""

from __future__ import annotations

import dataclasses

import pytest

from catalog.config import (
    BUILTIN_PROFILES,
    CAPABILITIES,
    OPERATIONS_BY_DRIVER,
    AuthSpec,
    RuntimeProfile,
    UnknownOperationError,
)
from nodes import wire


def _profile(base_url: str | None, **operations: str) -> RuntimeProfile:
    return RuntimeProfile(
        name="t",
        base=None,
        adapter="openai_compat",
        driver="openai_chat",
        base_url=base_url,
        operations=operations,
    )


def test_closed_operation_sets_per_driver_r_prof_3():
    """R-PROF-3: each driver's operation set, exactly."""
    assert OPERATIONS_BY_DRIVER["openai_chat"] == {
        "models",
        "chat_completions",
        "responses",
        "count_tokens",
    }
    assert OPERATIONS_BY_DRIVER["anthropic_messages"] == {"models", "messages", "count_tokens"}
    assert OPERATIONS_BY_DRIVER["openai_responses"] == {"models", "responses", "count_tokens"}
    assert OPERATIONS_BY_DRIVER["ollama"] == {"models", "chat"}
    assert OPERATIONS_BY_DRIVER["cli"] == {"chat"}


def test_every_builtin_declares_only_operations_of_its_driver_r_prof_3():
    """R-PROF-3: built-ins respect their driver's closed set."""
    for profile in BUILTIN_PROFILES.values():
        assert set(profile.operations) <= OPERATIONS_BY_DRIVER[profile.driver], profile.name


def test_capability_vocabulary_r_prof_4():
    """R-PROF-4: the capability names."""
    expected = {"messages", "chat", "responses", "streaming", "tool_calling", "count_tokens"}
    assert expected | {"models"} == CAPABILITIES
    for profile in BUILTIN_PROFILES.values():
        assert profile.capabilities <= CAPABILITIES


def test_admission_needs_every_capability_of_the_request_r_prof_4():
    """R-PROF-4: a streaming chat with tools needs chat, streaming and tool_calling."""
    glm, ollama = BUILTIN_PROFILES["glm"], BUILTIN_PROFILES["ollama"]
    needs = frozenset({"chat", "streaming", "tool_calling"})
    assert glm.admits(needs)
    assert not ollama.admits(needs)
    assert ollama.admits(frozenset({"chat", "streaming"}))
    assert not glm.admits(frozenset({"responses"}))
    assert glm.admits(frozenset())


def test_map_model_maps_known_keys_and_passes_others_through_r_prof_5():
    """R-PROF-5: model_mapping maps the external key; unmapped models are unchanged."""
    profile = dataclasses.replace(_profile("http://x/v1"), model_mapping={"qwen-local": "Qwen/Q"})
    assert profile.map_model("qwen-local") == "Qwen/Q"
    assert profile.map_model("other") == "other"
    assert BUILTIN_PROFILES["openai"].map_model("gpt-x") == "gpt-x"


@pytest.mark.parametrize(
    ("base_url", "path"),
    [
        ("http://h:8000/v1", "/chat/completions"),
        ("http://h:8000/v1/", "/chat/completions"),
        ("http://h:8000/v1", "chat/completions"),
        ("http://h:8000/v1/", "chat/completions"),
        ("http://h:8000/v1//", "//chat/completions"),
    ],
)
def test_relative_paths_join_exactly_once_r_prof_6(base_url, path):
    """R-PROF-6: no double and no missing slash, whatever the inputs' slashes."""
    profile = _profile(base_url, chat_completions=path)
    assert profile.resolve_operation_url("chat_completions") == "http://h:8000/v1/chat/completions"


def test_absolute_operation_urls_are_returned_unchanged_r_prof_6():
    """R-PROF-6: an absolute operation URL ignores the base URL."""
    absolute = "https://other.example/api/v2/chat?x"
    profile = _profile("http://h/v1", chat_completions=absolute)
    assert profile.resolve_operation_url("chat_completions") == absolute
    assert _profile(None, models="http://m.example/models").resolve_operation_url("models") == (
        "http://m.example/models"
    )


def test_unknown_operation_is_a_clear_key_error_r_prof_6():
    """R-PROF-6: asking for an undeclared operation names the profile and the operation."""
    with pytest.raises(KeyError) as caught:
        BUILTIN_PROFILES["glm"].resolve_operation_url("responses")
    assert isinstance(caught.value, UnknownOperationError)
    assert str(caught.value) == (
        "profile 'glm' has no operation 'responses' (declared: chat_completions, models)"
    )
    with pytest.raises(UnknownOperationError, match="no base_url"):
        _profile(None, models="/models").resolve_operation_url("models")


def test_builtin_urls_resolve_to_complete_upstream_urls_r_prof_6():
    """R-PROF-6: each built-in's operations resolve against its base URL."""
    assert BUILTIN_PROFILES["openai"].operation_urls() == {
        "models": "https://api.openai.com/v1/models",
        "chat_completions": "https://api.openai.com/v1/chat/completions",
        "responses": "https://api.openai.com/v1/responses",
    }
    assert BUILTIN_PROFILES["anthropic"].resolve_operation_url("messages") == (
        "https://api.anthropic.com/v1/messages"
    )
    assert BUILTIN_PROFILES["ollama"].operation_urls() == {
        "chat": "http://127.0.0.1:11434/api/chat",
        "models": "http://127.0.0.1:11434/api/tags",
    }


def test_glm_and_glm_coding_are_separate_identities_r_prof_7():
    """R-PROF-7: two endpoints sharing openai_chat, Bearer and capabilities; no responses."""
    glm, coding = BUILTIN_PROFILES["glm"], BUILTIN_PROFILES["glm_coding"]
    assert glm.name != coding.name and glm != coding
    assert glm.base_url == "https://api.z.ai/api/paas/v4"
    assert coding.base_url == "https://api.z.ai/api/coding/paas/v4"
    for profile in (glm, coding):
        assert profile.driver == "openai_chat" and profile.adapter == "openai_compat"
        assert profile.auth == AuthSpec("bearer", "Authorization", "Bearer")
        assert profile.capabilities == {"models", "chat", "streaming", "tool_calling"}
        assert set(profile.operations) == {"models", "chat_completions"}
    assert glm.resolve_operation_url("chat_completions") != coding.resolve_operation_url(
        "chat_completions"
    )


def test_builtin_catalog_contents():
    assert set(BUILTIN_PROFILES) == {
        "openai",
        "anthropic",
        "openai_responses",
        "glm",
        "glm_coding",
        "ollama",
        "cli",
    }
    openai = BUILTIN_PROFILES["openai"]
    assert (openai.driver, openai.auth.type) == ("openai_chat", "bearer")
    assert openai.capabilities == {"models", "chat", "responses", "streaming", "tool_calling"}
    anthropic = BUILTIN_PROFILES["anthropic"]
    assert anthropic.driver == "anthropic_messages"
    assert anthropic.auth == AuthSpec("header", "x-api-key", "")
    assert anthropic.extensions["headers"]["anthropic-version"] == "2023-06-01"
    assert wire.ANTHROPIC_VERSION == "2023-06-01"  # the Node's default agrees (R-XLATE-3)
    assert anthropic.capabilities == {
        "messages",
        "models",
        "streaming",
        "tool_calling",
        "count_tokens",
    }
    responses = BUILTIN_PROFILES["openai_responses"]
    assert responses.driver == "openai_responses"
    assert responses.capabilities == {"responses", "models", "streaming", "tool_calling"}
    ollama = BUILTIN_PROFILES["ollama"]
    assert (ollama.adapter, ollama.driver, ollama.auth.type) == ("ollama", "ollama", "none")
    assert ollama.capabilities == {"models", "chat", "streaming"}
    cli = BUILTIN_PROFILES["cli"]
    assert (cli.adapter, cli.capabilities, dict(cli.operations)) == (
        "cli",
        {"chat", "streaming"},
        {},
    )


def test_builtin_catalog_is_read_only():
    with pytest.raises(TypeError):
        BUILTIN_PROFILES["mine"] = BUILTIN_PROFILES["openai"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        BUILTIN_PROFILES["openai"].base_url = "http://evil"  # type: ignore[misc]
