"""The runtime protocol profile: an immutable, fully resolved snapshot (R-PROF-2..6)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from catalog.config.addresses import is_absolute_url

Adapter = Literal["openai_compat", "ollama", "cli"]
Driver = Literal["openai_chat", "anthropic_messages", "openai_responses", "ollama", "cli"]
AuthType = Literal["none", "bearer", "header"]

# R-PROF-3: each driver's closed operation set; ollama and cli are the non-tunnel adapters.
OPERATIONS_BY_DRIVER: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "openai_chat": frozenset({"models", "chat_completions", "responses", "count_tokens"}),
        "anthropic_messages": frozenset({"models", "messages", "count_tokens"}),
        "openai_responses": frozenset({"models", "responses", "count_tokens"}),
        "ollama": frozenset({"models", "chat"}),
        "cli": frozenset({"chat"}),
    }
)
# R-PROF-4: what a profile can declare; admission is per operation.
CAPABILITIES: frozenset[str] = frozenset(
    {"messages", "chat", "responses", "streaming", "tool_calling", "count_tokens", "models"}
)
# R-XLATE-4: how a provider switches reasoning on (``extensions.thinking``)
THINKING_STYLES = ("reasoning_effort", "glm", "enable_thinking", "none")


def default_thinking(driver: str) -> str:
    """The reasoning switch of a driver's profile that declares none."""
    return "reasoning_effort" if driver == "openai_chat" else "none"


ADAPTER_BY_DRIVER: Mapping[str, Adapter] = MappingProxyType(
    {
        "openai_chat": "openai_compat",
        "anthropic_messages": "openai_compat",
        "openai_responses": "openai_compat",
        "ollama": "ollama",
        "cli": "cli",
    }
)
# A capability that is served by an upstream operation needs that operation (per driver family).
CAPABILITY_OPERATION: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {
        "openai_compat": MappingProxyType(
            {
                "chat": "chat_completions",
                "messages": "messages",
                "responses": "responses",
                "count_tokens": "count_tokens",
                "models": "models",
            }
        ),
        "ollama": MappingProxyType({"chat": "chat", "models": "models"}),
        "cli": MappingProxyType({}),
    }
)


class UnknownOperationError(KeyError):
    """A profile was asked for an operation it does not declare."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown operation"


# Header names that carry credentials; a credential is only ever a secret reference.
CREDENTIAL_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"}
)


def freeze(value: Any) -> Any:
    """A read-only deep copy of JSON-like data (mappings become MappingProxyType, lists tuples)."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The JSON form of data made by ``freeze``."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class AuthSpec:
    """How the provider credential is put on the upstream request."""

    type: AuthType = "none"
    header: str = "Authorization"
    scheme: str = "Bearer"


@dataclass(frozen=True, slots=True)
class RuntimeProfile:
    """A resolved protocol profile; built-in, custom overlay or legacy-type alias."""

    name: str
    base: str | None
    adapter: Adapter
    driver: Driver
    base_url: str | None
    operations: Mapping[str, str] = field(default_factory=_empty, hash=False)
    auth: AuthSpec = field(default_factory=AuthSpec)
    capabilities: frozenset[str] = frozenset()
    model_mapping: Mapping[str, str] = field(default_factory=_empty, hash=False)
    extensions: Mapping[str, Any] = field(default_factory=_empty, hash=False)

    def map_model(self, model: str) -> str:
        """R-PROF-5: the provider's served target for ``model``; unmapped models pass unchanged."""
        return self.model_mapping.get(model, model)

    def resolve_operation_url(self, op: str) -> str:
        """R-PROF-6: the complete upstream URL of ``op``; relative paths join the base once."""
        try:
            path = self.operations[op]
        except KeyError:
            declared = ", ".join(sorted(self.operations)) or "none"
            raise UnknownOperationError(
                f"profile {self.name!r} has no operation {op!r} (declared: {declared})"
            ) from None
        if is_absolute_url(path):
            return path
        if not self.base_url:
            raise UnknownOperationError(
                f"profile {self.name!r} has no base_url to resolve operation {op!r}"
            )
        return f"{self.base_url.rstrip('/')}/{path.lstrip('/')}"

    def operation_urls(self) -> dict[str, str]:
        """Every declared operation resolved to its complete URL."""
        return {op: self.resolve_operation_url(op) for op in self.operations}

    def extension_headers(self) -> dict[str, str]:
        """R-XLATE-3: the static request headers of ``extensions.headers`` (checked at load)."""
        headers = self.extensions.get("headers")
        return {str(k): str(v) for k, v in headers.items()} if isinstance(headers, Mapping) else {}

    def thinking(self) -> str:
        """R-XLATE-4: the provider's reasoning switch (``extensions.thinking``, checked at
        load), else its driver's: ``reasoning_effort`` for Chat Completions, else ``none``."""
        style = self.extensions.get("thinking")
        return style if isinstance(style, str) else default_thinking(self.driver)

    def admits(self, needs: frozenset[str]) -> bool:
        """R-PROF-4: True when the profile declares every capability in ``needs``."""
        return needs <= self.capabilities

    def with_base_url(self, base_url: str | None) -> RuntimeProfile:
        """A copy with a provider's own ``base_url`` in place of the profile's."""
        return self if base_url is None else replace(self, base_url=base_url)

    def needs_base_url(self) -> bool:
        """True when some operation is a relative path."""
        return any(not is_absolute_url(path) for path in self.operations.values())
