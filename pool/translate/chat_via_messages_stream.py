"""Chat Completions client, Anthropic Messages provider: the streamed answer.

Anthropic events in (``message_start`` ... ``message_stop``, ``ping``, ``error``);
``chat.completion.chunk`` events out, a usage chunk when the client asked for one
(``stream_options.include_usage``), then ``[DONE]``.
"""

from __future__ import annotations

import time
from typing import Any

from pool.translate.chat_via_messages import FINISH_REASONS, chat_usage, completion_id
from pool.translate.common import (
    DONE_EVENT,
    SseTranslator,
    data_event,
    error_text,
    json_event,
    upstream,
)


class ChatViaMessagesStream(SseTranslator):
    """One stream's state: ids, the tool-call index of each tool_use block, usage."""

    def __init__(self, model: str, include_usage: bool) -> None:
        super().__init__()
        self._include_usage = include_usage
        self._id = completion_id(None)
        self._model = model
        self._created = int(time.time())
        self._tool_index: dict[int, int] = {}  # content block index -> tool call index
        self._usage: dict[str, Any] = {}
        self._reason: str | None = None

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return data_event(
            {
                "id": self._id,
                "object": "chat.completion.chunk",
                "created": self._created,
                "model": self._model,
                "choices": [choice],
            }
        )

    def _event(self, data: str, out: list[str]) -> None:
        event = json_event(data)
        kind = event.get("type") if event is not None else None
        if kind == "message_start":
            message = event.get("message") or {}  # type: ignore[union-attr]
            self._id = completion_id(message.get("id"))
            self._model = str(message.get("model") or self._model)
            self._usage.update(message.get("usage") or {})
            out.append(self._chunk({"role": "assistant", "content": ""}))
        elif kind == "content_block_start":
            self._block_start(event, out)  # type: ignore[arg-type]
        elif kind == "content_block_delta":
            self._block_delta(event, out)  # type: ignore[arg-type]
        elif kind == "message_delta":
            delta = event.get("delta") or {}  # type: ignore[union-attr]
            self._usage.update(event.get("usage") or {})  # type: ignore[union-attr]
            if delta.get("stop_reason"):
                self._reason = FINISH_REASONS.get(delta["stop_reason"], "stop")
        elif kind == "message_stop":
            self._finish(out)
        elif kind == "error":
            raise upstream(error_text(event))  # type: ignore[arg-type]
        # ping, content_block_stop and event types added later carry nothing to translate

    def _block_start(self, event: dict[str, Any], out: list[str]) -> None:
        block = event.get("content_block") or {}
        if block.get("type") == "tool_use":
            index = self._tool_index[event.get("index", 0)] = len(self._tool_index)
            call = {
                "index": index,
                "id": str(block.get("id", "")),
                "type": "function",
                "function": {"name": str(block.get("name", "")), "arguments": ""},
            }
            out.append(self._chunk({"tool_calls": [call]}))
        elif block.get("type") == "text" and block.get("text"):
            out.append(self._chunk({"content": block["text"]}))

    def _block_delta(self, event: dict[str, Any], out: list[str]) -> None:
        delta = event.get("delta") or {}
        kind = delta.get("type")
        if kind == "text_delta":
            out.append(self._chunk({"content": str(delta.get("text", ""))}))
        elif kind == "input_json_delta":
            index = self._tool_index.get(event.get("index", 0))
            part = delta.get("partial_json")
            if index is None:
                raise upstream("the provider sent tool input for a block it never opened")
            if part:
                call = {"index": index, "function": {"arguments": str(part)}}
                out.append(self._chunk({"tool_calls": [call]}))
        # thinking_delta and signature_delta: thinking is never requested by a translation

    def _finish(self, out: list[str]) -> None:
        if self._reason is None:
            raise upstream("the provider's stream ended before its stop reason")
        self._done = True
        out.append(self._chunk({}, self._reason))
        if self._include_usage:
            usage = chat_usage(self._usage)
            out.append(
                data_event(
                    {
                        "id": self._id,
                        "object": "chat.completion.chunk",
                        "created": self._created,
                        "model": self._model,
                        "choices": [],
                        "usage": usage,
                    }
                )
            )
        out.append(DONE_EVENT)
