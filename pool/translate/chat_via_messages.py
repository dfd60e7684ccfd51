"""Chat Completions client, Anthropic Messages provider: the request and the whole answer.

Field table: docs/http-api.md, "Translation". What has no counterpart is refused naming the
field (R-XLATE-2).
"""

from __future__ import annotations

import time
from typing import Any

from pool.translate.common import dumps, invalid, loads, unsupported, upstream
from pool.translate.messages_via_chat import IMAGE_MEDIA_TYPES

DEFAULT_MAX_TOKENS = 4096  # Anthropic requires max_tokens; Chat does not (docs/http-api.md)
_KNOWN = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "stop",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "user",
        "n",
        "response_format",
    }
)
FINISH_REASONS = {  # Anthropic stop_reason -> Chat finish_reason
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def _image_block(part: dict[str, Any], where: str) -> dict[str, Any]:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str) or not url:
        raise invalid(f"{where}.image_url.url", "is required")
    if url.startswith("data:"):
        head, _, data = url.partition(",")
        media = head[5:].split(";", 1)[0]
        if not head.endswith(";base64") or not data:
            raise unsupported(f"{where}.image_url.url", "must be a base64 data URL")
        if media not in IMAGE_MEDIA_TYPES:
            raise unsupported(
                f"{where}.image_url.url",
                f"has image type '{media}'; supported: {', '.join(sorted(IMAGE_MEDIA_TYPES))}",
            )
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
    if url.startswith(("https://", "http://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise unsupported(f"{where}.image_url.url", "must be an http(s) or data: URL")


def _blocks(content: Any, where: str, *, images: bool) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if content is None:
        return []
    if not isinstance(content, list):
        raise invalid(where, "must be a string or an array of content parts")
    out = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            out.append({"type": "text", "text": part["text"]})
        elif kind == "image_url" and images:
            out.append(_image_block(part, at))
        else:
            raise unsupported(f"{at}.type", f"content part '{kind}' is not translatable")
    return out


def _text(content: Any, where: str) -> str:
    return "\n".join(b["text"] for b in _blocks(content, where, images=False))


def _tool_use(call: Any, where: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise invalid(f"{where}.function.name", "is required")
    raw = fn.get("arguments") or "{}"
    try:
        arguments = loads(raw) if isinstance(raw, str) else None
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise invalid(f"{where}.function.arguments", "must be a JSON object encoded as a string")
    return {
        "type": "tool_use",
        "id": str(call.get("id", "")),
        "name": fn["name"],
        "input": arguments,
    }


def _append(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Consecutive turns of one role become one turn, as the Messages API requires."""
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": blocks})


def _conversation(raw: list[Any]) -> tuple[list[str], list[dict[str, Any]]]:
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for i, msg in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise invalid(where, "must be an object")
        role = msg.get("role")
        if "name" in msg:
            raise unsupported(f"{where}.name")
        if role in ("system", "developer"):
            if messages:
                raise unsupported(where, "is a system message after the conversation started")
            system.append(_text(msg.get("content"), f"{where}.content"))
        elif role == "user":
            blocks = _blocks(msg.get("content"), f"{where}.content", images=True)
            _append(messages, "user", blocks)
        elif role == "assistant":
            blocks = _blocks(msg.get("content"), f"{where}.content", images=False)
            for k, call in enumerate(msg.get("tool_calls") or []):
                blocks.append(_tool_use(call, f"{where}.tool_calls[{k}]"))
            _append(messages, "assistant", blocks)
        elif role == "tool":
            if not isinstance(msg.get("tool_call_id"), str):
                raise invalid(f"{where}.tool_call_id", "is required")
            result = {
                "type": "tool_result",
                "tool_use_id": msg["tool_call_id"],
                "content": _text(msg.get("content"), f"{where}.content"),
            }
            _append(messages, "user", [result])
        else:
            raise unsupported(f"{where}.role", f"role '{role}' is not translatable")
    return system, messages


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise invalid("tools", "must be an array")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise unsupported(f"tools[{i}].type", "only function tools are translatable")
        if not isinstance(fn.get("name"), str):
            raise invalid(f"tools[{i}].function.name", "is required")
        entry: dict[str, Any] = {
            "name": fn["name"],
            "input_schema": fn.get("parameters") or {"type": "object", "properties": {}},
        }
        if isinstance(fn.get("description"), str):
            entry["description"] = fn["description"]
        out.append(entry)
    return out


def _tool_choice(choice: Any) -> dict[str, Any]:
    if choice == "auto":
        return {"type": "auto"}
    if choice == "none":
        return {"type": "none"}
    if choice == "required":
        return {"type": "any"}
    fn = choice.get("function") if isinstance(choice, dict) else None
    if isinstance(fn, dict) and isinstance(fn.get("name"), str):
        return {"type": "tool", "name": fn["name"]}
    raise unsupported("tool_choice", "is not translatable")


def messages_request(data: dict[str, Any], model: str) -> dict[str, Any]:
    """A Chat Completions request as an Anthropic Messages request for ``model``."""
    for name in data:
        if name not in _KNOWN:
            raise unsupported(name)
    if data.get("n") not in (None, 1):
        raise unsupported("n", "other than 1 has no counterpart")
    fmt = data.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise unsupported("response_format")
    system, messages = _conversation(data["messages"])
    if not messages:
        raise invalid("messages", "must hold at least one non-system message")
    out: dict[str, Any] = {"model": model, "messages": messages}
    if system:
        out["system"] = "\n\n".join(system)
    limit = data.get("max_completion_tokens", data.get("max_tokens"))
    out["max_tokens"] = limit if isinstance(limit, int) else DEFAULT_MAX_TOKENS
    temperature = data.get("temperature")
    if temperature is not None:
        if not isinstance(temperature, int | float) or not 0 <= temperature <= 1:
            raise unsupported("temperature", "above 1 has no counterpart (range 0..1)")
        out["temperature"] = temperature
    if data.get("top_p") is not None:
        out["top_p"] = data["top_p"]
    stop = data.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else stop
    if data.get("tools"):
        out["tools"] = _tools(data["tools"])
    if data.get("tool_choice") is not None:
        out["tool_choice"] = _tool_choice(data["tool_choice"])
    if data.get("parallel_tool_calls") is False and out.get("tools"):
        out["tool_choice"] = {
            **out.get("tool_choice", {"type": "auto"}),
            "disable_parallel_tool_use": True,
        }
    if isinstance(data.get("user"), str):
        out["metadata"] = {"user_id": data["user"]}
    if data.get("stream"):
        out["stream"] = True
    return out


def chat_usage(usage: Any) -> dict[str, int]:
    raw = usage if isinstance(usage, dict) else {}
    prompt = sum(
        int(raw.get(k) or 0)
        for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )
    completion = int(raw.get("output_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion_id(message_id: Any) -> str:
    return "chatcmpl-" + str(message_id or int(time.time() * 1000))


def chat_response(body: str) -> str:
    """An Anthropic ``message`` as a Chat Completions answer."""
    try:
        data = loads(body)
        blocks = data["content"]
    except (ValueError, LookupError, TypeError):
        blocks = None
    if not isinstance(blocks, list):
        raise upstream("the provider's answer is not an Anthropic message")
    texts = [b["text"] for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
    calls = [
        {
            "id": str(b.get("id", "")),
            "type": "function",
            "function": {"name": str(b.get("name", "")), "arguments": dumps(b.get("input") or {})},
        }
        for b in blocks
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return dumps(
        {
            "id": completion_id(data.get("id")),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(data.get("model", "")),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": FINISH_REASONS.get(data.get("stop_reason"), "stop"),
                }
            ],
            "usage": chat_usage(data.get("usage")),
        }
    )
