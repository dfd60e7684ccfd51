"""Normalized execution on Ollama: OpenAI chat request in, OpenAI chat output out.

The request is translated to ``/api/chat``; its NDJSON stream becomes
``chat.completion.chunk`` SSE events ending with a usage chunk and ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from nodes.agent.adapters.base import AdapterError, Emit, RunSpec, parse_json_body, send
from nodes.agent.adapters.http import (
    HttpClient,
    Upstream,
    merge_headers,
    provider_headers,
    slot_headers,
)
from nodes.agent.adapters.sse import DONE, ChatChunks, chat_completion
from nodes.tokens import token_figure
from nodes.wire import ProviderPayload, Usage

_CHAT_OPERATIONS = ("chat", "chat_completions")
_OPTIONS = {  # OpenAI request field -> Ollama option
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "seed": "seed",
    "stop": "stop",
    "max_tokens": "num_predict",
    "max_completion_tokens": "num_predict",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


def _content(value: Any) -> tuple[str, list[str]]:
    """Text and base64 images of an OpenAI message content (string or parts)."""
    if isinstance(value, str):
        return value, []
    texts, images = [], []
    for part in value if isinstance(value, list) else []:
        if not isinstance(part, dict):
            continue
        if part.get("type") in ("text", "input_text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif part.get("type") == "image_url":
            url = (part.get("image_url") or {}).get("url", "")
            if isinstance(url, str) and url.startswith("data:") and "," in url:
                images.append(url.split(",", 1)[1])
    return "\n".join(texts), images


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except ValueError:
            return {}
    return raw if isinstance(raw, dict) else {}


def to_ollama(body: dict[str, Any], stream: bool) -> dict[str, Any]:
    """Translate an OpenAI chat completions request into an Ollama /api/chat request."""
    messages = []
    for msg in body.get("messages") or []:
        if not isinstance(msg, dict):
            continue
        role = "system" if msg.get("role") == "developer" else msg.get("role", "user")
        text, images = _content(msg.get("content"))
        out: dict[str, Any] = {"role": role, "content": text}
        if images:
            out["images"] = images
        calls = msg.get("tool_calls") or []
        if calls:
            out["tool_calls"] = [
                {
                    "function": {
                        "name": c["function"].get("name", ""),
                        "arguments": _arguments(c["function"].get("arguments")),
                    }
                }
                for c in calls
                if isinstance(c, dict) and isinstance(c.get("function"), dict)
            ]
        if role == "tool" and isinstance(msg.get("name"), str):
            out["tool_name"] = msg["name"]
        messages.append(out)
    request: dict[str, Any] = {
        "model": body.get("model", ""),  # the served target, mapped once by the Edge (R-PROF-5)
        "messages": messages,
        "stream": stream,
    }
    options = {dst: body[src] for src, dst in _OPTIONS.items() if body.get(src) is not None}
    if options:
        request["options"] = options
    if body.get("tools"):
        request["tools"] = body["tools"]
    fmt = body.get("response_format")
    if isinstance(fmt, dict):
        if fmt.get("type") == "json_object":
            request["format"] = "json"
        elif fmt.get("type") == "json_schema":
            request["format"] = (fmt.get("json_schema") or {}).get("schema", "json")
    return request


def _tool_calls(raw: Any, start: int, run_id: str) -> list[dict[str, Any]]:
    calls = []
    for i, call in enumerate(raw if isinstance(raw, list) else [], start=start):
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        calls.append(
            {
                "index": i,
                "id": f"call_{run_id}_{i}",
                "type": "function",
                "function": {
                    "name": fn.get("name", ""),
                    "arguments": json.dumps(fn.get("arguments", {}), ensure_ascii=True),
                },
            }
        )
    return calls


def _finish(done_reason: Any, had_tools: bool) -> str:
    if had_tools:
        return "tool_calls"
    return "length" if done_reason == "length" else "stop"


def _usage(final: dict[str, Any]) -> Usage:
    return Usage(  # R-IN-6
        input_tokens=token_figure(final.get("prompt_eval_count"), "ollama prompt_eval_count"),
        output_tokens=token_figure(final.get("eval_count"), "ollama eval_count"),
    )


def _decode_line(line: bytes) -> dict[str, Any] | None:
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        raise AdapterError("upstream_error", "upstream sent a malformed NDJSON line") from None
    if not isinstance(obj, dict):
        return None
    if obj.get("error"):
        raise AdapterError(
            "upstream_error",
            "the upstream reported an error",
            detail=f"upstream error: {str(obj['error'])[:300]}",
        )
    return obj


async def _drain(upstream: Upstream) -> None:
    """Read to the end after ``done`` so the connection can be reused (best effort)."""
    with contextlib.suppress(AdapterError, TimeoutError):
        async with asyncio.timeout(1.0):
            await upstream.read_all()


class OllamaAdapter:
    """Runs OpenAI chat requests on an Ollama server's /api/chat."""

    def __init__(self, provider: ProviderPayload, http: HttpClient) -> None:
        self.provider = provider
        self._http = http
        self._headers, self._secrets = provider_headers(provider)

    def _url(self, operation: str) -> str:
        if operation in _CHAT_OPERATIONS:
            for name in _CHAT_OPERATIONS:
                if self.provider.operations.get(name):
                    return self.provider.operations[name]
        raise AdapterError(
            "bad_request",
            "the provider does not serve this operation",
            detail=f"provider {self.provider.id} does not serve operation {operation}",
        )

    async def run(self, request: RunSpec, emit: Emit) -> Usage | None:
        url = self._url(request.operation)
        body = parse_json_body(request.body)
        upstream_body = to_ollama(body, request.stream)
        model = upstream_body["model"]
        async with Upstream(
            self._http,
            "POST",
            url,
            provider=self.provider,
            # R-MGD-11: a managed run's slot secret as the provider's auth header.
            headers=merge_headers(self._headers, slot_headers(self.provider, request.credential)),
            body=json.dumps(upstream_body, ensure_ascii=False).encode(),
            first_byte_s=self.provider.first_byte_timeout_s,
            idle_s=self.provider.idle_timeout_s,
            secrets=self._secrets + ((request.credential,) if request.credential else ()),
        ) as upstream:
            if request.stream:
                return await self._stream(upstream, request.run_id, model, emit)
            raw = await upstream.read_all()
        final = _decode_line(raw)
        if final is None:
            raise AdapterError("upstream_error", "upstream returned an empty response")
        message = final.get("message") or {}
        out: dict[str, Any] = {"role": "assistant", "content": message.get("content", "")}
        calls = _tool_calls(message.get("tool_calls"), 0, request.run_id)
        if calls:
            out["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
        usage = _usage(final)
        finish = _finish(final.get("done_reason"), bool(calls))
        await send(emit, chat_completion(request.run_id, model, out, finish, usage))
        return usage

    async def _stream(self, upstream: Upstream, run_id: str, model: str, emit: Emit) -> Usage:
        chunks = ChatChunks(run_id, model)
        pending, tools_seen = b"", 0
        cap = self._http.limits.max_line_bytes
        while data := await upstream.read():
            *lines, pending = (pending + data).split(b"\n")
            if len(pending) > cap or any(len(line) > cap for line in lines):
                raise AdapterError(  # R-TLS-4: a line is never buffered without bound
                    "upstream_error",
                    f"the upstream sent an NDJSON line over {cap} bytes (limits.max_line_bytes)",
                )
            events = []  # every event from this read goes out in one emit
            for line in lines:
                obj = _decode_line(line)
                if obj is None:
                    continue
                message = obj.get("message") or {}
                calls = _tool_calls(message.get("tool_calls"), tools_seen, run_id)
                tools_seen += len(calls)
                if message.get("content") or calls:
                    events.append(chunks.delta(message.get("content") or None, calls))
                if obj.get("done"):
                    usage = _usage(obj)
                    events += [
                        chunks.finish(_finish(obj.get("done_reason"), tools_seen > 0)),
                        chunks.usage(usage),
                        DONE,
                    ]
                    await send(emit, "".join(events))
                    await _drain(upstream)
                    return usage
            if events:
                await send(emit, "".join(events))
        raise AdapterError("upstream_error", "upstream stream ended before it was done")

    async def aclose(self) -> None:
        """The shared HTTP session belongs to the registry."""
