"""A fake Anthropic Messages API: ``/v1/messages`` (JSON and SSE), ``count_tokens``, models.

It speaks the documented wire format: SSE events ``message_start``, ``content_block_start``,
``ping``, ``content_block_delta`` (``text_delta``, ``input_json_delta``), ``content_block_stop``,
``message_delta`` (stop reason and output usage), ``message_stop`` and ``error``. Like the real
API it refuses a request without the ``anthropic-version`` header or with a malformed body,
so a driver or translator that sends either fails its tests.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tests.fakes.base import FakeServer, current, loop_text, pieces

VERSION_HEADER = "anthropic-version"
_BLOCK_TYPES = {"text", "image", "tool_use", "tool_result", "document", "thinking"}
_IMAGE_TYPES = {"image/jpeg", "image/png", "image/gif", "image/webp"}


def _sse(event: str, obj: dict[str, Any]) -> str:
    return f"event: {event}\ndata: " + json.dumps(obj, separators=(",", ":")) + "\n\n"


def _error(status: int, kind: str, message: str) -> web.Response:
    current().status = status
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return web.json_response(body, status=status)


def check_request(body: Any, *, count_only: bool = False) -> str | None:
    """What the real API would refuse in a Messages request, or None when it is valid."""
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return "model: Field required"
    if not count_only and not isinstance(body.get("max_tokens"), int):
        return "max_tokens: Field required"
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        return "system: Input should be a valid string or list"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: Field required"
    for i, msg in enumerate(messages):
        # A system-role message inside the conversation, as Claude Code sends it.
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant", "system"):
            return f"messages.{i}.role: Input should be 'user', 'assistant' or 'system'"
        content = msg.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            return f"messages.{i}.content: Input should be a valid list"
        for j, block in enumerate(content):
            if not isinstance(block, dict) or block.get("type") not in _BLOCK_TYPES:
                return f"messages.{i}.content.{j}: unknown content block type"
            if block["type"] == "image":
                source = block.get("source") or {}
                if source.get("type") == "base64" and source.get("media_type") not in _IMAGE_TYPES:
                    return f"messages.{i}.content.{j}.source.media_type: unsupported"
                if source.get("type") not in ("base64", "url"):
                    return f"messages.{i}.content.{j}.source.type: unsupported"
            if block["type"] == "tool_use" and not isinstance(block.get("input"), dict):
                return f"messages.{i}.content.{j}.input: Input should be a valid dictionary"
            if block["type"] == "tool_result" and not isinstance(block.get("tool_use_id"), str):
                return f"messages.{i}.content.{j}.tool_use_id: Field required"
    for i, tool in enumerate(body.get("tools") or []):
        if not isinstance(tool, dict) or not isinstance(tool.get("input_schema"), dict):
            return f"tools.{i}.input_schema: Field required"
    return None


def _answered_tool(messages: list[Any]) -> bool:
    """True when the last user turn carries tool results: the model then answers in text."""
    last = messages[-1] if messages else {}
    content = last.get("content") if isinstance(last, dict) else None
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


class FakeAnthropic(FakeServer):
    """Answers ``reply_text``, or ``parallel_tools`` calls of the first tool when given tools."""

    def __init__(self, api_key: str | None = None) -> None:
        super().__init__()
        self.api_key = api_key  # when set, ``x-api-key`` must carry it
        self.reply_text = "Claude fake says hello in pieces."
        self.input_tokens = 17
        self.output_tokens = 9
        self.cache_read_input_tokens = 0  # R-COST-1: reported, apart from input_tokens, if set
        self.tool_input: dict[str, Any] = {"city": "Paris"}
        self.parallel_tools = 1
        self.call_tools = True  # answer a request that has tools with a call of the first

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/messages", self.messages),
            web.post("/v1/messages/count_tokens", self.count_tokens),
            web.get("/v1/models", self.list_models),
        ]

    def _refused(self, request: web.Request, count_only: bool = False) -> web.Response | None:
        if (refused := self._gate()) is not None:
            return refused
        problem = check_request(current().json, count_only=count_only)
        return _error(400, "invalid_request_error", problem) if problem else None

    def _gate(self) -> web.Response | None:
        """The header, key and injected-status checks every route makes."""
        headers = current().headers
        if VERSION_HEADER not in headers:
            return _error(400, "invalid_request_error", "anthropic-version: header is required")
        if self.api_key is not None and headers.get("x-api-key") != self.api_key:
            return _error(401, "authentication_error", "invalid x-api-key")
        if self.faults.status is not None:
            return _error(self.faults.status, "api_error", self.faults.error_message)
        return None

    def _content(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        tools = body.get("tools") or []
        choice = body.get("tool_choice") or {}
        answered = _answered_tool(body["messages"])
        if self.call_tools and tools and choice.get("type") != "none" and not answered:
            name = tools[0].get("name", "tool")
            return [
                {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": self.tool_input}
                for i in range(self.parallel_tools)
            ]
        return [{"type": "text", "text": self.reply_text}]

    async def messages(self, request: web.Request) -> web.StreamResponse:
        if self.faults.stall_before_first_byte is not None:
            await self.stall(self.faults.stall_before_first_byte)
        if (refused := self._refused(request)) is not None:
            return refused
        body = current().json
        content = self._content(body)
        stop = "tool_use" if content[0]["type"] == "tool_use" else "end_turn"
        message = {
            "id": "msg_fake01",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {**self._input(), "output_tokens": self.output_tokens},
        }
        if not body.get("stream"):
            return self.reply(request, message)
        start = {**message, "content": [], "stop_reason": None}
        start["usage"] = {**self._input(), "output_tokens": 1}
        chunks = [_sse("message_start", {"type": "message_start", "message": start})]
        chunks.append(_sse("ping", {"type": "ping"}))
        for index, block in enumerate(content):
            chunks += self._block_events(index, block)
        if self.faults.end_early:
            chunks = chunks[:4]
        elif self.faults.stream_error:
            error = {"type": "overloaded_error", "message": "Overloaded"}
            chunks = [*chunks[:4], _sse("error", {"type": "error", "error": error})]
        else:
            delta = {"stop_reason": stop, "stop_sequence": None}
            usage = {"output_tokens": self.output_tokens}
            chunks.append(
                _sse("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
            )
            chunks.append(_sse("message_stop", {"type": "message_stop"}))
        return await self.stream(request, chunks, "text/event-stream")

    def _block_events(self, index: int, block: dict[str, Any]) -> list[str]:
        def delta(d: dict[str, Any]) -> str:
            return _sse(
                "content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}
            )

        if block["type"] == "text":
            opening = {"type": "text", "text": ""}
            looped = loop_text(self.faults)
            parts = looped or pieces(block["text"])
            deltas = [delta({"type": "text_delta", "text": p}) for p in parts]
        else:
            opening = {**block, "input": {}}
            raw = json.dumps(block["input"], separators=(",", ":"))
            half = len(raw) // 2
            deltas = [
                delta({"type": "input_json_delta", "partial_json": part})
                for part in ("", raw[:half], raw[half:])
            ]
        start = {"type": "content_block_start", "index": index, "content_block": opening}
        stop = {"type": "content_block_stop", "index": index}
        return [
            _sse("content_block_start", start),
            *deltas,
            _sse("content_block_stop", stop),
        ]

    def _input(self) -> dict[str, int]:
        if not self.cache_read_input_tokens:
            return {"input_tokens": self.input_tokens}
        return {"input_tokens": self.input_tokens,
                "cache_read_input_tokens": self.cache_read_input_tokens}  # fmt: skip

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        if (refused := self._refused(request, count_only=True)) is not None:
            return refused
        return self.reply(request, {"input_tokens": self.input_tokens})

    async def list_models(self, request: web.Request) -> web.StreamResponse:
        if (refused := self._gate()) is not None:
            return refused
        data = [{"type": "model", "id": "claude-fake", "display_name": "Claude Fake"}]
        return self.reply(request, {"data": data, "has_more": False})
