"""A fake OpenAI-compatible upstream: chat completions (stream, tools, usage), Responses,
Anthropic Messages (SSE), count_tokens and models."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web

from tests.fakes.base import FakeServer, current, loop_text, pieces


def _sse(obj: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return head + "data: " + json.dumps(obj, separators=(",", ":")) + "\n\n"


class FakeOpenAI(FakeServer):
    """Answers with ``reply_text`` and reports ``prompt_tokens``/``completion_tokens``."""

    def __init__(self) -> None:
        super().__init__()
        self.reply_text = "Hello from the fake upstream, streaming word by word."
        self.prompt_tokens = 11
        self.completion_tokens = 7
        # R-COST-1: of the prompt tokens, those "read from the prompt cache": reported in
        # prompt_tokens_details / input_tokens_details (and as cache_read_input_tokens,
        # apart from input_tokens, on /v1/messages) when not 0
        self.cached_tokens = 0
        self.models = ["fake-model", "fake-model-large"]
        self.tool_arguments = '{"city":"Paris"}'
        self.call_tools = True  # answer a request that has tools with a call of the first
        self.reasoning_text: str | None = None  # Chat answers carry it as reasoning_content
        # A model of a prefix cache (R-AFF-2, scripts/bench_affinity.py): (cold s, warm s),
        # the time to the first byte for a conversation head this upstream has not / has seen.
        self.prefix_cache: tuple[float, float] | None = None
        self.heads_seen: set[str] = set()
        self.warm_hits = 0

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/chat/completions", self.chat),
            web.post("/v1/responses", self.responses),
            web.post("/v1/messages", self.messages),
            web.post("/v1/messages/count_tokens", self.count_tokens),
            web.get("/v1/models", self.list_models),
            # Z.AI's General API and Coding Plan paths (R-PROF-7), served alike.
            web.post("/api/paas/v4/chat/completions", self.chat),
            web.post("/api/coding/paas/v4/chat/completions", self.chat),
        ]

    # --- chat completions ------------------------------------------------------------------

    def _first_byte(self, body: dict[str, Any], cold: float, warm: float) -> float:
        """As vLLM's prefix cache: a conversation whose head (its first two messages) ran
        here before starts sooner."""
        head = json.dumps((body.get("messages") or [])[:2], sort_keys=True)
        if head in self.heads_seen:
            self.warm_hits += 1
            return warm
        self.heads_seen.add(head)
        return cold

    def _tool(self, body: dict[str, Any]) -> str | None:
        tools = body.get("tools") or []
        if not self.call_tools or not tools or body.get("tool_choice") == "none":
            return None
        messages = body.get("messages") or [{}]
        if messages[-1].get("role") == "tool":  # a tool round trip: now answer in text
            return None
        return str(tools[0].get("function", {}).get("name", "tool"))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        if (failed := await self.fail_if_told(request)) is not None:
            return failed
        body = current().json or {}
        if self.prefix_cache is not None:
            await asyncio.sleep(self._first_byte(body, *self.prefix_cache))
        model, tool = body.get("model", "fake-model"), self._tool(body)
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }
        if self.cached_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        base = {"id": "chatcmpl-fake", "created": int(time.time()), "model": model}
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": self.reply_text}
            if self.reasoning_text:  # as vLLM, GLM and DeepSeek report it
                message["reasoning_content"] = self.reasoning_text
            if tool:
                message = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": tool, "arguments": self.tool_arguments},
                        }
                    ],
                }
            return self.reply(
                request,
                {
                    **base,
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "finish_reason": "tool_calls" if tool else "stop",
                        }
                    ],
                    "usage": usage,
                },
            )
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            extra = {"usage": None} if include_usage else {}
            return _sse({**base, "object": "chat.completion.chunk", "choices": [choice], **extra})

        chunks = [chunk({"role": "assistant", "content": ""})]
        if self.reasoning_text:
            chunks += [chunk({"reasoning_content": p}) for p in pieces(self.reasoning_text)]
        if tool:
            half = len(self.tool_arguments) // 2
            chunks.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": tool, "arguments": ""},
                            }
                        ]
                    }
                )
            )
            for part in (self.tool_arguments[:half], self.tool_arguments[half:]):
                chunks.append(
                    chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
                )
        else:
            looped = loop_text(self.faults)
            chunks += [chunk({"content": p}) for p in looped or pieces(self.reply_text)]
        if self.faults.stream_error:  # as vLLM and others report a failure mid-stream
            error = {"error": {"message": "model crashed", "type": "server_error", "code": 500}}
            return await self.stream(request, [*chunks[:2], _sse(error)], "text/event-stream")
        if self.faults.end_early:
            return await self.stream(request, chunks[:2], "text/event-stream")
        chunks.append(chunk({}, "tool_calls" if tool else "stop"))
        if include_usage:
            chunks.append(
                _sse({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage})
            )
        chunks.append("data: [DONE]\n\n")
        return await self.stream(request, chunks, "text/event-stream")

    # --- responses -----------------------------------------------------------------------

    async def responses(self, request: web.Request) -> web.StreamResponse:
        if (failed := await self.fail_if_told(request)) is not None:
            return failed
        body = current().json or {}
        usage: dict[str, Any] = {
            "input_tokens": self.prompt_tokens,
            "output_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }
        if self.cached_tokens:
            usage["input_tokens_details"] = {"cached_tokens": self.cached_tokens}
        output = [
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": self.reply_text, "annotations": []}],
            }
        ]
        final = {
            "id": "resp_fake",
            "object": "response",
            "model": body.get("model", ""),
            "status": "completed",
            "output": output,
            "usage": usage,
        }
        if not body.get("stream"):
            return self.reply(request, final)
        started = {**final, "status": "in_progress", "output": [], "usage": None}
        chunks = [_sse({"type": "response.created", "response": started}, "response.created")]
        item = {**output[0], "status": "in_progress", "content": []}
        part = {"type": "output_text", "text": "", "annotations": []}
        at = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
        chunks.append(
            _sse(
                {"type": "response.output_item.added", "output_index": 0, "item": item},
                "response.output_item.added",
            )
        )
        chunks.append(
            _sse(
                {"type": "response.content_part.added", **at, "part": part},
                "response.content_part.added",
            )
        )
        for p in pieces(self.reply_text):
            chunks.append(
                _sse(
                    {
                        "type": "response.output_text.delta",
                        "item_id": "msg_1",
                        "output_index": 0,
                        "content_index": 0,
                        "delta": p,
                    },
                    "response.output_text.delta",
                )
            )
        text = {"type": "response.output_text.done", **at, "text": self.reply_text}
        chunks.append(_sse(text, "response.output_text.done"))
        done = {"type": "response.output_item.done", "output_index": 0, "item": output[0]}
        chunks.append(_sse(done, "response.output_item.done"))
        chunks.append(_sse({"type": "response.completed", "response": final}, "response.completed"))
        return await self.stream(request, chunks, "text/event-stream")

    # --- anthropic messages ----------------------------------------------------------------

    async def messages(self, request: web.Request) -> web.StreamResponse:
        if (failed := await self.fail_if_told(request)) is not None:
            return failed
        body = current().json or {}
        model = body.get("model", "")
        if not body.get("stream"):
            return self.reply(
                request,
                {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [{"type": "text", "text": self.reply_text}],
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": {
                        **self._messages_input(),
                        "output_tokens": self.completion_tokens,
                    },
                },
            )
        start = {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "usage": {**self._messages_input(), "output_tokens": 1},
        }
        chunks = [
            _sse({"type": "message_start", "message": start}, "message_start"),
            _sse(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
                "content_block_start",
            ),
        ]
        for p in pieces(self.reply_text):
            chunks.append(
                _sse(
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": p},
                    },
                    "content_block_delta",
                )
            )
        chunks += [
            _sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
            _sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn"},
                    "usage": {"output_tokens": self.completion_tokens},
                },
                "message_delta",
            ),
            _sse({"type": "message_stop"}, "message_stop"),
        ]
        return await self.stream(request, chunks, "text/event-stream")

    def _messages_input(self) -> dict[str, int]:
        """Anthropic's input usage: cache reads apart from ``input_tokens``."""
        if not self.cached_tokens:
            return {"input_tokens": self.prompt_tokens}
        return {"input_tokens": self.prompt_tokens - self.cached_tokens,
                "cache_read_input_tokens": self.cached_tokens}  # fmt: skip

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        if (failed := await self.fail_if_told(request)) is not None:
            return failed
        return self.reply(request, {"input_tokens": self.prompt_tokens})

    async def list_models(self, request: web.Request) -> web.StreamResponse:
        if (failed := await self.fail_if_told(request)) is not None:
            return failed
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in self.models]
        return self.reply(request, {"object": "list", "data": data})
