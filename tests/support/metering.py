"""A usage record for metering tests: one request of app-notebook on qwen-local."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pool.metering import RequestRecord

BASE: dict[str, Any] = {
    "operation": "chat_completions",
    "model_group": "qwen-local",
    "provider_id": "vllm-local",
    "principal_ref": "team-research",
    "token_ref": "app-notebook",
    "status": 200,
    "code": None,
    "estimated": False,
}


def record_factory(**defaults: Any) -> Callable[..., RequestRecord]:
    """``record(**changes)`` building records from BASE, then ``defaults``, then ``changes``."""

    def record(**changes: Any) -> RequestRecord:
        return RequestRecord(**{**BASE, **defaults, **changes})

    return record
