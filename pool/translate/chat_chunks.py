"""Reading a Chat Completions answer: the whole body's first choice, and the walk over a
stream's ``chat.completion.chunk`` events that every translation from Chat shares (the
subclass says what each part becomes)."""

from __future__ import annotations

from typing import Any

from pool.translate.common import SseTranslator, error_text, json_event, loads, upstream


def chat_answer(body: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A whole Chat Completions answer: (the body, its first choice, that choice's message)."""
    try:
        data = loads(body)
        choice = data["choices"][0]
        message = choice["message"]
    except (ValueError, LookupError, TypeError):
        raise upstream("the provider's answer is not a Chat Completions response") from None
    if not isinstance(message, dict):
        raise upstream("the provider's answer is not a Chat Completions response")
    return data, choice, message


def reasoning_text(message: dict[str, Any]) -> str:
    """A Chat message's or delta's reasoning text: ``reasoning_content`` (vLLM, GLM,
    DeepSeek) or ``reasoning`` (newer vLLM, Ollama's OpenAI API); "" when none."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


class ChatChunkTranslator(SseTranslator):
    """``[DONE]`` ends the stream, an in-band ``error`` fails it; otherwise, per chunk:
    ``_first`` once, ``_usage``, then per choice ``_reasoning``, ``_text``, ``_tool`` and
    ``_finish``."""

    def __init__(self) -> None:
        super().__init__()
        self._seen = False

    def _event(self, data: str, out: list[str]) -> None:
        chunk = json_event(data)
        if chunk is None:  # [DONE]
            self._end(out)
            return
        if "error" in chunk:
            raise upstream(error_text(chunk))
        if not self._seen:
            self._seen = True
            self._first(chunk, out)
        if isinstance(chunk.get("usage"), dict):
            self._usage(chunk["usage"])
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            reasoning = reasoning_text(delta)
            if reasoning:
                self._reasoning(reasoning, out)
            content = delta.get("content")
            if isinstance(content, str) and content:
                self._text(content, out)
            for call in delta.get("tool_calls") or ():
                self._tool(call, out)
            if choice.get("finish_reason"):
                self._finish(str(choice["finish_reason"]))

    def _first(self, chunk: dict[str, Any], out: list[str]) -> None:
        raise NotImplementedError

    def _usage(self, usage: dict[str, Any]) -> None:
        raise NotImplementedError

    def _reasoning(self, text: str, out: list[str]) -> None:
        """Reasoning text: left out unless the subclass shows it."""

    def _text(self, text: str, out: list[str]) -> None:
        raise NotImplementedError

    def _tool(self, call: dict[str, Any], out: list[str]) -> None:
        raise NotImplementedError

    def _finish(self, reason: str) -> None:
        raise NotImplementedError
