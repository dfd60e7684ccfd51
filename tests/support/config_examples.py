"""A small valid config document, for tests and local tools that need a snapshot to start from."""

from __future__ import annotations

import copy
from typing import Any

# A fixture Node token for loopback tests (never a real credential) and its sha256.
EXAMPLE_NODE_TOKEN = "node-token"
EXAMPLE_NODE_TOKEN_HASH = "1e16c337973f9ad03ebb4df8c7d71ded6a5b12f4c89a3f8866d33efc62f0c54b"

_DOCUMENT: dict[str, Any] = {
    "edge": {"id": "edge-test", "listen": "127.0.0.1:7700"},
    "admin": {"listen": "127.0.0.1:7701"},
    "openai": {"listen": "127.0.0.1:8080", "long_context_threshold_tokens": 100000},
    "provider_pool": {"max_queue": 16, "queue_timeout_ms": 30000},
    "nodes": [
        {
            "id": "node-a",
            "token_hash_sha256": EXAMPLE_NODE_TOKEN_HASH,
            "providers": [
                {
                    "id": "compat-a",
                    "type": "openai_compat",
                    "base_url": "http://127.0.0.1:9001/v1",
                    "capacity": 2,
                    "long_context_capacity": 1,
                    "context_window_tokens": 131072,
                    "priority": 10,
                },
                {"id": "ollama-a", "profile": "ollama", "capacity": 1, "priority": 50},
                {"id": "cli-a", "type": "cli", "command": ["cat"], "capacity": 1, "priority": 90},
            ],
        }
    ],
    "models": [
        {"id": "chat-model", "providers": {"compat-a": "served-chat", "ollama-a": "llama3"}},
        {"id": "echo", "providers": {"cli-a": "echo"}},
    ],
}


def example_document() -> dict[str, Any]:
    """A fresh deep copy of a small valid Edge document (one Node, three provider kinds)."""
    return copy.deepcopy(_DOCUMENT)
