"""Built-in protocol profiles and the legacy provider ``type`` aliases (R-PROF-2, 7, 8, 9)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from catalog.config.profiles.model import ADAPTER_BY_DRIVER, AuthSpec, RuntimeProfile, freeze

BEARER = AuthSpec("bearer", "Authorization", "Bearer")
NO_AUTH = AuthSpec("none")
# The Messages API version (R-XLATE-3); the Node's default is nodes.wire.ANTHROPIC_VERSION.
ANTHROPIC_VERSION = "2023-06-01"


def _profile(
    name: str,
    driver: str,
    base_url: str | None,
    operations: dict[str, str],
    capabilities: set[str],
    auth: AuthSpec = BEARER,
    extensions: dict[str, object] | None = None,
) -> RuntimeProfile:
    return RuntimeProfile(
        name=name,
        base=None,
        adapter=ADAPTER_BY_DRIVER[driver],
        driver=driver,  # type: ignore[arg-type]
        base_url=base_url,
        operations=MappingProxyType(dict(operations)),
        auth=auth,
        capabilities=frozenset(capabilities),
        extensions=freeze(extensions or {}),
    )


_CHAT_OPS = {"models": "/models", "chat_completions": "/chat/completions"}
_CHAT_CAPS = {"models", "chat", "streaming", "tool_calling"}
_MESSAGES_OPS = {
    "models": "/models",
    "messages": "/messages",
    "count_tokens": "/messages/count_tokens",
}
_MESSAGES_CAPS = {"messages", "models", "streaming", "tool_calling", "count_tokens"}

BUILTIN_PROFILES: Mapping[str, RuntimeProfile] = MappingProxyType(
    {
        "openai": _profile(
            "openai",
            "openai_chat",
            "https://api.openai.com/v1",
            {**_CHAT_OPS, "responses": "/responses"},
            {*_CHAT_CAPS, "responses"},
        ),
        "anthropic": _profile(
            "anthropic",
            "anthropic_messages",
            "https://api.anthropic.com/v1",
            _MESSAGES_OPS,
            _MESSAGES_CAPS,
            auth=AuthSpec("header", "x-api-key", ""),
            extensions={"headers": {"anthropic-version": ANTHROPIC_VERSION}},
        ),
        "openai_responses": _profile(
            "openai_responses",
            "openai_responses",
            "https://api.openai.com/v1",
            {"models": "/models", "responses": "/responses"},
            {"responses", "models", "streaming", "tool_calling"},
        ),
        # R-PROF-7: two identities, two endpoints, no responses, no fallback between them.
        # R-XLATE-4: Z.AI's own reasoning switch, ``thinking: {type: enabled|disabled}``.
        "glm": _profile(
            "glm",
            "openai_chat",
            "https://api.z.ai/api/paas/v4",
            _CHAT_OPS,
            _CHAT_CAPS,
            extensions={"thinking": "glm"},
        ),
        "glm_coding": _profile(
            "glm_coding",
            "openai_chat",
            "https://api.z.ai/api/coding/paas/v4",
            _CHAT_OPS,
            _CHAT_CAPS,
            extensions={"thinking": "glm"},
        ),
        "ollama": _profile(
            "ollama",
            "ollama",
            "http://127.0.0.1:11434",
            {"chat": "/api/chat", "models": "/api/tags"},
            {"models", "chat", "streaming"},
            auth=NO_AUTH,
        ),
        "cli": _profile("cli", "cli", None, {}, {"chat", "streaming"}, auth=NO_AUTH),
    }
)

# Legacy provider ``type`` values; the Seulgivibe aliases keep their name as the label (R-PROF-8).
LEGACY_TYPES: tuple[str, ...] = (
    "openai_compat",
    "cli",
    "ollama",
    "seulgivibe_claude",
    "seulgivibe_openai",
)
SEULGIVIBE_TYPES: frozenset[str] = frozenset({"seulgivibe_claude", "seulgivibe_openai"})
# Legacy types whose upstream is the provider's own base_url (no default endpoint).
TYPES_NEEDING_BASE_URL: frozenset[str] = frozenset({"openai_compat", *SEULGIVIBE_TYPES})


def legacy_profile(type_name: str, base_url: str | None) -> RuntimeProfile:
    """Normalize a legacy provider ``type`` into its runtime profile (R-PROF-2, R-PROF-9)."""
    if type_name in ("cli", "ollama"):
        return BUILTIN_PROFILES[type_name].with_base_url(base_url)
    if type_name == "seulgivibe_claude":
        return _profile(type_name, "anthropic_messages", base_url, _MESSAGES_OPS, _MESSAGES_CAPS)
    if type_name in ("openai_compat", "seulgivibe_openai"):
        return _profile(type_name, "openai_chat", base_url, _CHAT_OPS, _CHAT_CAPS)
    raise ValueError(f"unknown legacy provider type {type_name!r}")
