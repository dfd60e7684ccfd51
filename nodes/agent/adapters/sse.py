"""Server-sent events: reading usage out of a relayed stream, and writing chat chunks."""

from __future__ import annotations

import json
import time
from typing import Any

from nodes.agent.adapters.base import usage_from
from nodes.wire import Usage

MAX_LINE_CHARS = 16 * 1024 * 1024  # a longer "line" is not an SSE event we can use


class UsageScanner:
    """Watches relayed SSE text on the side and keeps the usage it reports.

    OpenAI chat: a chunk's ``usage``; Responses: ``response.completed``'s response.usage;
    Anthropic: ``message_start`` input tokens and ``message_delta`` output tokens.
    Splits on ``\\n`` only (U+2028 inside JSON strings is not a line break).
    """

    def __init__(self) -> None:
        self._pending: list[str] = []
        self._pending_len = 0
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.cached_input_tokens = 0  # R-COST-1: taken with the input figure

    @property
    def usage(self) -> Usage | None:
        if self.input_tokens is None and self.output_tokens is None:
            return None
        return Usage(
            input_tokens=self.input_tokens or 0,
            output_tokens=self.output_tokens or 0,
            cached_input_tokens=self.cached_input_tokens,
        )

    def feed(self, text: str) -> None:
        if "\n" not in text:
            self._keep(text)
            return
        head, _, rest = text.partition("\n")
        first = "".join(self._pending) + head
        self._pending, self._pending_len = [], 0
        lines = rest.split("\n")
        self._keep(lines.pop())
        self._line(first)
        for line in lines:
            self._line(line)

    def _keep(self, text: str) -> None:
        if text:
            self._pending.append(text)
            self._pending_len += len(text)
            if self._pending_len > MAX_LINE_CHARS:
                self._pending, self._pending_len = [], 0

    def _line(self, line: str) -> None:
        if not line.startswith("data:") or "usage" not in line:
            return
        try:
            event = json.loads(line[5:].strip())
        except ValueError:
            return
        if isinstance(event, dict):
            self._event(event)

    def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            self._take(usage)
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            response = event.get("response")
            self._take(response.get("usage") if isinstance(response, dict) else None)
        else:  # OpenAI chat chunk, Anthropic message_delta
            self._take(event.get("usage"))

    def _take(self, raw: Any) -> None:
        if not isinstance(raw, dict):
            return
        found = usage_from(raw)
        if found is None:
            return
        if "prompt_tokens" in raw or "input_tokens" in raw:
            self.input_tokens = found.input_tokens
            self.cached_input_tokens = found.cached_input_tokens
        if "completion_tokens" in raw or "output_tokens" in raw:
            self.output_tokens = found.output_tokens


def data_event(obj: Any) -> str:
    """One SSE event; ensure_ascii escapes U+2028/U+2029 that break line-based readers."""
    return "data: " + json.dumps(obj, ensure_ascii=True, separators=(",", ":")) + "\n\n"


DONE = "data: [DONE]\n\n"


class ChatChunks:
    """OpenAI ``chat.completion.chunk`` events for one normalized run."""

    def __init__(self, run_id: str, model: str) -> None:
        self.id = f"chatcmpl-{run_id}"
        self.model = model
        self.created = int(time.time())
        self._role_sent = False

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        return data_event(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": choices,
                **extra,
            }
        )

    def delta(self, content: str | None = None, tool_calls: list[Any] | None = None) -> str:
        delta: dict[str, Any] = {}
        if not self._role_sent:
            delta["role"] = "assistant"
            self._role_sent = True
        if content is not None:
            delta["content"] = content
        if tool_calls:
            delta["tool_calls"] = tool_calls
        return self._chunk([{"index": 0, "delta": delta, "finish_reason": None}])

    def finish(self, reason: str) -> str:
        return self._chunk([{"index": 0, "delta": {}, "finish_reason": reason}])

    def usage(self, usage: Usage) -> str:
        return self._chunk([], usage=openai_usage(usage))


def openai_usage(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def chat_completion(
    run_id: str, model: str, message: dict[str, Any], finish_reason: str, usage: Usage
) -> str:
    """A complete non-stream ``chat.completion`` body."""
    body = {
        "id": f"chatcmpl-{run_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": openai_usage(usage),
    }
    return json.dumps(body, ensure_ascii=True, separators=(",", ":"))
