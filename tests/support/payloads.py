"""Provider payloads pointing at the fakes, as the Edge would compile them."""

from __future__ import annotations

import sys
from typing import Any

import msgspec

from nodes import wire
from tests.fakes import CLI_TOOL

_OPENAI_PATHS = {
    "openai_chat": {"chat_completions": "/v1/chat/completions", "responses": "/v1/responses"},
    "anthropic_messages": {
        "messages": "/v1/messages",
        "count_tokens": "/v1/messages/count_tokens",
    },
    "openai_responses": {"responses": "/v1/responses"},
}


def openai_provider(
    base_url: str, *, pid: str = "fake-openai", driver: str = "openai_chat", **kw: Any
) -> wire.ProviderPayload:
    operations = {op: base_url + path for op, path in _OPENAI_PATHS[driver].items()}
    operations["models"] = base_url + "/v1/models"
    return wire.ProviderPayload(
        id=pid, label=pid, adapter="openai_compat", driver=driver, operations=operations, **kw
    )


def ollama_provider(base_url: str, *, pid: str = "fake-ollama", **kw: Any) -> wire.ProviderPayload:
    return wire.ProviderPayload(
        id=pid,
        label=pid,
        adapter="ollama",
        driver="ollama",
        operations={"chat": base_url + "/api/chat"},
        **kw,
    )


def cli_provider(*args: str, pid: str = "fake-cli", **kw: Any) -> wire.ProviderPayload:
    return wire.ProviderPayload(
        id=pid,
        label=pid,
        adapter="cli",
        driver="cli",
        command=[sys.executable, CLI_TOOL, *args],
        **kw,
    )


def node_payload(*providers: wire.ProviderPayload, node_id: str = "node-test") -> wire.NodePayload:
    """A payload whose revision is the content hash, as the Edge computes it."""
    doc = {"node_id": node_id, "providers": [msgspec.to_builtins(p) for p in providers]}
    return wire.NodePayload(
        node_id=node_id, revision=wire.payload_revision(doc), providers=list(providers)
    )


def chat_body(text: str = "Say hello", *, model: str = "fake-model", **kw: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], **kw}
