"""Anthropic Messages client, Chat Completions provider: the request and the whole answer.

Field table: docs/http-api.md, "Translation". What has no counterpart is refused naming the
field (R-XLATE-2).
"""

from __future__ import annotations

import time
from typing import Any

from pool.translate.chat_chunks import chat_answer
from pool.translate.common import (
    dumps,
    invalid,
    loads,
    named_tools,
    unsupported,
    upstream,
)

IMAGE_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
# Anthropic request fields copied under the same name; the rest are mapped below or refused.
_SAME = ("temperature", "top_p", "max_tokens", "stream")
_KNOWN = frozenset(
    {
        *_SAME,
        "model",
        "messages",
        "system",
        "stop_sequences",
        "tools",
        "tool_choice",
        "metadata",
    }
)
MAX_STOP_SEQUENCES = 4  # the Chat Completions limit
STOP_REASONS = {  # Chat finish_reason -> Anthropic stop_reason
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def _text_of(blocks: Any, where: str) -> str:
    """A system prompt or tool result: a string or a list of text blocks."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise invalid(where, "must be a string or an array of text blocks")
    parts = []
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else None
            raise unsupported(f"{where}[{i}].type", f"'{kind}' is not translatable here")
        text = block.get("text")
        if not isinstance(text, str):
            raise invalid(f"{where}[{i}].text", "must be a string")
        parts.append(text)
    return "\n".join(parts)


def check_image(images: str, url: bool, where: str) -> None:
    """Refuse an image the provider would drop: ``images`` is ``all``, ``inline`` (base64
    only: Ollama) or ``none`` (CLI) — see ``images_for``."""
    if images == "none":
        raise unsupported(where, "is an image; this model's provider takes text only")
    if images == "inline" and url:
        raise unsupported(
            where, "is an image by URL; this model's provider takes base64 images only"
        )


def images_for(driver: str) -> str:
    return {"ollama": "inline", "cli": "none"}.get(driver, "all")


def image_part(source: Any, where: str, images: str = "all") -> dict[str, Any]:
    """An Anthropic image source as a Chat ``image_url`` part."""
    if not isinstance(source, dict):
        raise invalid(where, "must be an object")
    kind = source.get("type")
    check_image(images, kind == "url", f"{where}.type")
    if kind == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    if kind == "base64":
        media = source.get("media_type")
        if media not in IMAGE_MEDIA_TYPES:
            raise unsupported(
                f"{where}.media_type",
                f"'{media}' is not a supported image type ({', '.join(sorted(IMAGE_MEDIA_TYPES))})",
            )
        data = source.get("data")
        if not isinstance(data, str) or not data:
            raise invalid(f"{where}.data", "must be base64 text")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    raise unsupported(f"{where}.type", f"image source '{kind}' is not translatable")


def _user_turn(content: list[Any], where: str, images: str) -> list[dict[str, Any]]:
    """One user turn: its tool results become ``tool`` messages first, then the rest."""
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append(image_part(block.get("source"), f"{at}.source", images))
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                raise invalid(f"{at}.tool_use_id", "is required")
            text = _text_of(block.get("content", ""), f"{at}.content")
            if block.get("is_error"):
                text = "[tool error] " + text  # docs/http-api.md: Chat has no error flag
            results.append({"role": "tool", "tool_call_id": call_id, "content": text})
        else:
            raise unsupported(f"{at}.type", f"content block '{kind}' is not translatable")
    out = results
    if parts:
        only_text = all(p["type"] == "text" for p in parts)
        joined: Any = "\n".join(p["text"] for p in parts) if only_text else parts
        out.append({"role": "user", "content": joined})
    return out


def _assistant_turn(content: list[Any], where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            if not isinstance(block.get("input"), dict):
                raise invalid(f"{at}.input", "must be an object")
            calls.append(
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {
                        "name": str(block.get("name", "")),
                        "arguments": dumps(block["input"]),
                    },
                }
            )
        else:
            raise unsupported(f"{at}.type", f"content block '{kind}' is not translatable")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for tool in named_tools(tools, (None, "custom"), "server tool"):
        function: dict[str, Any] = {
            "name": tool["name"],
            "parameters": tool.get("input_schema") or {"type": "object"},
        }
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    if not isinstance(choice, dict):
        raise invalid("tool_choice", "must be an object")
    kind = choice.get("type")
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise unsupported("tool_choice.type", f"'{kind}' is not translatable")
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def chat_request(data: dict[str, Any], model: str, images: str = "all") -> dict[str, Any]:
    """An Anthropic Messages request as a Chat Completions request for ``model``;
    ``images`` says which images the provider takes (``images_for``)."""
    for name in data:
        if name not in _KNOWN:
            raise unsupported(name)
    chat: dict[str, Any] = {name: data[name] for name in _SAME if name in data}
    chat["model"] = model
    messages: list[dict[str, Any]] = []
    if "system" in data:
        messages.append({"role": "system", "content": _text_of(data["system"], "system")})
    for i, msg in enumerate(data["messages"]):
        where = f"messages[{i}]"
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
            raise invalid(f"{where}.role", "must be 'user' or 'assistant'")
        content = msg.get("content")
        if isinstance(content, str):
            messages.append({"role": msg["role"], "content": content})
        elif not isinstance(content, list):
            raise invalid(f"{where}.content", "must be a string or an array of content blocks")
        elif msg["role"] == "user":
            messages += _user_turn(content, where, images)
        else:
            messages.append(_assistant_turn(content, where))
    chat["messages"] = messages
    stops = data.get("stop_sequences")
    if stops:
        if not isinstance(stops, list) or len(stops) > MAX_STOP_SEQUENCES:
            raise unsupported("stop_sequences", f"allows at most {MAX_STOP_SEQUENCES} here")
        chat["stop"] = stops
    if data.get("tools"):
        chat["tools"] = _tools(data["tools"])
    if "tool_choice" in data:
        _tool_choice(data["tool_choice"], chat)
    metadata = data.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        chat["user"] = metadata["user_id"]
    if data.get("stream"):
        chat["stream_options"] = {"include_usage": True}  # usage for message_delta
    return chat


def tool_input(arguments: Any, name: str) -> dict[str, Any]:
    """A Chat tool call's JSON arguments as an Anthropic ``tool_use.input`` object."""
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        value = loads(arguments)
    except ValueError:
        raise upstream(
            f"the provider's call of tool '{name}' has arguments that are not valid JSON"
        ) from None
    if not isinstance(value, dict):
        raise upstream(f"the provider's call of tool '{name}' has arguments that are not an object")
    return value


def usage_of(chat_usage: Any) -> dict[str, int]:
    usage = chat_usage if isinstance(chat_usage, dict) else {}
    return {
        "input_tokens": int(usage.get("prompt_tokens") or 0),
        "output_tokens": int(usage.get("completion_tokens") or 0),
    }


def message_id(chat_id: Any) -> str:
    text = str(chat_id or int(time.time() * 1000))
    return text if text.startswith("msg_") else "msg_" + text


def messages_response(body: str) -> str:
    """A Chat Completions answer as an Anthropic ``message``."""
    data, choice, message = chat_answer(body)
    content: list[dict[str, Any]] = []
    if isinstance(message.get("content"), str) and message["content"]:
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        name = str(fn.get("name", ""))
        content.append(
            {
                "type": "tool_use",
                "id": str(call.get("id", "")),
                "name": name,
                "input": tool_input(fn.get("arguments"), name),
            }
        )
    reason = choice.get("finish_reason")
    return dumps(
        {
            "id": message_id(data.get("id")),
            "type": "message",
            "role": "assistant",
            "model": str(data.get("model", "")),
            "content": content,
            "stop_reason": STOP_REASONS.get(str(reason), "end_turn"),
            "stop_sequence": None,
            "usage": usage_of(data.get("usage")),
        }
    )


def count_tokens_estimate(input_tokens: int) -> str:
    """``count_tokens`` where the provider has none: the documented estimate (docs/http-api.md)."""
    return dumps({"input_tokens": input_tokens})
