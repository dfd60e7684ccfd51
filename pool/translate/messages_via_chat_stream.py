"""Anthropic Messages client, Chat Completions provider: the streamed answer.

``chat.completion.chunk`` events in; ``message_start``, ``content_block_start``/``_delta``/
``_stop`` (``thinking_delta`` when the client asked for thinking, ``text_delta``,
``input_json_delta``), ``message_delta`` (stop reason, usage) and
``message_stop`` out. ``message_delta`` waits for the end of the upstream stream, because a
Chat stream reports usage after its finish reason.
"""

from __future__ import annotations

from typing import Any

from pool.translate.chat_chunks import ChatChunkTranslator
from pool.translate.common import named_event, upstream
from pool.translate.messages_via_chat import STOP_REASONS, message_id, tool_input, usage_of


class MessagesViaChatStream(ChatChunkTranslator):
    """One stream's state: the open content block and the tool calls seen by index."""

    def __init__(self, model: str, thinking: bool = False) -> None:
        super().__init__()
        self._model = model
        self._thinking = thinking  # the provider's reasoning as thinking blocks
        self._block = -1  # index of the open content block, -1 when none
        self._block_kind = ""
        self._next_block = 0
        self._tools: dict[int, tuple[int, str, list[str]]] = {}  # chat index -> (block, name, args)
        self._reason: str | None = None
        self._usage_seen: dict[str, int] = {"input_tokens": 0, "output_tokens": 0}

    # --- events -------------------------------------------------------------------------

    def _usage(self, usage: dict[str, Any]) -> None:
        self._usage_seen = usage_of(usage)

    def _finish(self, reason: str) -> None:
        self._reason = STOP_REASONS.get(reason, "end_turn")

    def _first(self, chunk: dict[str, Any], out: list[str]) -> None:
        message: dict[str, Any] = {
            "id": message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": str(chunk.get("model") or self._model),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        out.append(named_event("message_start", {"type": "message_start", "message": message}))

    def _open(self, kind: str, block: dict[str, Any], out: list[str]) -> int:
        self._stop_block(out)
        index = self._block = self._next_block
        self._next_block += 1
        self._block_kind = kind
        out.append(
            named_event(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": block},
            )
        )
        return index

    def _stop_block(self, out: list[str]) -> None:
        if self._block < 0:
            return
        if self._block_kind == "tool_use":
            for block, name, args in self._tools.values():
                if block == self._block:
                    tool_input("".join(args), name)  # a provider error when not a JSON object
        out.append(
            named_event("content_block_stop", {"type": "content_block_stop", "index": self._block})
        )
        self._block = -1

    def _reasoning(self, text: str, out: list[str]) -> None:
        if not self._thinking:
            return
        if self._block_kind != "thinking" or self._block < 0:
            self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""}, out)
        out.append(self._delta({"type": "thinking_delta", "thinking": text}))

    def _text(self, text: str, out: list[str]) -> None:
        if self._block_kind != "text" or self._block < 0:
            self._open("text", {"type": "text", "text": ""}, out)
        delta = {"type": "text_delta", "text": text}
        out.append(self._delta(delta))

    def _tool(self, call: dict[str, Any], out: list[str]) -> None:
        index = call.get("index", 0)
        fn = call.get("function") or {}
        known = self._tools.get(index)
        if known is None:
            name = str(fn.get("name") or "")
            block = {"type": "tool_use", "id": str(call.get("id") or ""), "name": name, "input": {}}
            known = self._tools[index] = (self._open("tool_use", block, out), name, [])
        elif known[0] != self._block:
            raise upstream("the provider interleaved tool call deltas; they cannot be carried over")
        part = fn.get("arguments")
        if isinstance(part, str) and part:
            known[2].append(part)
            out.append(self._delta({"type": "input_json_delta", "partial_json": part}))

    def _delta(self, delta: dict[str, Any]) -> str:
        body = {"type": "content_block_delta", "index": self._block, "delta": delta}
        return named_event("content_block_delta", body)

    def _end(self, out: list[str]) -> None:
        """At ``[DONE]`` or the upstream's end: the stop reason and usage, reported last."""
        if self._reason is None:
            super()._end(out)
        self._done = True
        self._stop_block(out)
        delta = {"stop_reason": self._reason, "stop_sequence": None}
        event = {"type": "message_delta", "delta": delta, "usage": self._usage_seen}
        out.append(named_event("message_delta", event))
        out.append(named_event("message_stop", {"type": "message_stop"}))
