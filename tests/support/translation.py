"""One Edge with a provider of every protocol, for the translation end-to-end tests
(R-XLATE-1): ``translation_stack(directory)``, ``metric(stack, name, **labels)``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.fakes import CLI_TOOL
from tests.support.stack import Stack

PROVIDER_KEY = "sk-canary-xlate-provider-3f9a"
UPSTREAMS = {"main": "openai", "ollama": "ollama", "claude": "anthropic"}
PROVIDERS = [
    {"id": "p-chat", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 4},
    # R-PROF-7: Chat only, no Responses; the host is redirected to the loopback fake.
    {"id": "p-glm", "profile": "glm", "base_url": "{up:main}/api/paas/v4", "capacity": 4},
    {"id": "p-ollama", "profile": "ollama_tools", "base_url": "{up:ollama}", "capacity": 4},
    {
        "id": "p-claude",
        "profile": "anthropic",
        "base_url": "{up:claude}/v1",
        "capacity": 4,
        "credential": {"env": "IOP_TEST_XLATE_KEY"},
    },
    {"id": "p-cli", "profile": "cli", "command": [sys.executable, CLI_TOOL, "echo"], "capacity": 2},
]
PROFILES = {
    "ollama_tools": {
        "base": "ollama",
        "capabilities": ["models", "chat", "streaming", "tool_calling"],
    }
}
MODELS = [
    {"id": "claude-over-chat", "providers": {"p-chat": "served-gpt"}, "translate": True},
    {"id": "claude-over-ollama", "providers": {"p-ollama": "llama3:8b"}, "translate": True},
    {"id": "gpt-over-claude", "providers": {"p-claude": "claude-served"}, "translate": True},
    {"id": "claude-over-cli", "providers": {"p-cli": "echo"}, "translate": True},
    {"id": "responses-over-glm", "providers": {"p-glm": "glm-4.6"}, "translate": True},
    {"id": "chat-plain", "providers": {"p-chat": "served-gpt"}},
    {"id": "glm-plain", "providers": {"p-glm": "glm-4.6"}},
]


def translation_stack(
    directory: Path,
    *,
    providers: list[dict[str, Any]] = PROVIDERS,
    models: list[dict[str, Any]] = MODELS,
    profiles: dict[str, Any] = PROFILES,
    env: dict[str, str] | None = None,
) -> Stack:
    """Not started: use it as a context manager."""
    return Stack(
        directory,
        upstreams=UPSTREAMS,
        providers=providers,
        models=models,
        profiles=profiles,
        env={"IOP_TEST_XLATE_KEY": PROVIDER_KEY, **(env or {})},
    )


def metric(stack: Stack, name: str, **labels: str) -> float:
    """The sum of a sample of the Edge's control ``/metrics`` over the rows matching ``labels``."""
    return sum(
        sample.value
        for sample in stack.metrics()
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )
