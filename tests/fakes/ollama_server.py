"""A fake Ollama server: ``/api/chat`` with NDJSON streaming, tool calls and eval counts."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tests.fakes.base import FakeServer, current, pieces


class FakeOllama(FakeServer):
    def __init__(self) -> None:
        super().__init__()
        self.reply_text = "Ollama says hello in pieces."
        self.prompt_eval_count = 13
        self.eval_count = 5
        self.tool_arguments: dict[str, Any] = {"city": "Seoul"}

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/api/chat", self.chat), web.get("/api/tags", self.tags)]

    async def chat(self, request: web.Request) -> web.StreamResponse:
        if self.faults.redirect_to is not None or self.faults.endless_body is not None:
            answer = await self.fail_if_told(request)
            assert answer is not None
            return answer
        if self.faults.stall_before_first_byte is not None:
            await self.stall(self.faults.stall_before_first_byte)
        if self.faults.status is not None:
            current().status = self.faults.status
            return web.json_response(
                {"error": self.faults.error_message}, status=self.faults.status
            )
        body = current().json or {}
        model = body.get("model", "")
        tools = body.get("tools") or []
        tool = tools[0]["function"]["name"] if tools else None
        if (body.get("messages") or [{}])[-1].get("role") == "tool":
            tool = None  # a tool round trip: now answer in text

        def line(message: dict[str, Any], done: bool = False, **extra: Any) -> str:
            obj = {
                "model": model,
                "created_at": "2026-01-01T00:00:00Z",
                "message": message,
                "done": done,
                **extra,
            }
            return json.dumps(obj) + "\n"

        final_extra = {
            "done_reason": "stop",
            "prompt_eval_count": self.prompt_eval_count,
            "eval_count": self.eval_count,
        }
        calls = [{"function": {"name": tool, "arguments": self.tool_arguments}}] if tool else []
        if not body.get("stream", True):
            message: dict[str, Any] = {
                "role": "assistant",
                "content": "" if tool else self.reply_text,
            }
            if calls:
                message["tool_calls"] = calls
            return self.reply(
                request,
                {
                    "model": model,
                    "created_at": "2026-01-01T00:00:00Z",
                    "message": message,
                    "done": True,
                    **final_extra,
                },
            )
        if tool:
            lines = [line({"role": "assistant", "content": "", "tool_calls": calls})]
        else:
            lines = [line({"role": "assistant", "content": p}) for p in pieces(self.reply_text)]
        lines.append(line({"role": "assistant", "content": ""}, True, **final_extra))
        return await self.stream(request, lines, "application/x-ndjson")

    async def tags(self, request: web.Request) -> web.StreamResponse:
        return self.reply(request, {"models": [{"name": "llama3:8b", "model": "llama3:8b"}]})
