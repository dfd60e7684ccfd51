"""Anthropic Messages client, Chat Completions provider: the request and the whole answer.

Field table: docs/http-api.md, "Translation". What has no counterpart is refused naming the
field (R-XLATE-2).
"""

from __future__ import annotations

import time
from typing import Any

from pool.translate.chat_chunks import chat_answer, reasoning_text
from pool.translate.common import dumps, invalid, loads, unsupported, upstream
from pool.translate.fields import MESSAGES_TO_CHAT, Options
from pool.translate.reasoning import messages_switch

IMAGE_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
# Anthropic request fields copied under the same name; the rest: pool.translate.fields.
_SAME = ("temperature", "top_p", "max_tokens", "stream")
MAX_STOP_SEQUENCES = 4  # the Chat Completions limit
STOP_REASONS = {  # Chat finish_reason -> Anthropic stop_reason
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
_THINKING_BLOCKS = ("thinking", "redacted_thinking")
# Keys of a custom tool that Chat's function carries; cache_control and defer_loading are
# dropped by their rows, any other key by its own name.
_TOOL_KEYS = frozenset({"type", "name", "description", "input_schema", "strict"})


def _text_of(blocks: Any, where: str, options: Options) -> str:
    """A system prompt or tool result: a string or a list of text blocks."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise invalid(where, "must be a string or an array of text blocks")
    parts = []
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else None
            raise unsupported(f"{where}[{i}].type", f"'{_shown(kind)}' is not translatable here")
        text = block.get("text")
        if not isinstance(text, str):
            raise invalid(f"{where}[{i}].text", "must be a string")
        _hints(block, options)
        parts.append(text)
    return "\n".join(parts)


def _shown(value: Any) -> str:
    """A client's value inside an error message: a string as is, anything else by its type."""
    return value[:64] if isinstance(value, str) else type(value).__name__


def _hints(block: dict[str, Any], options: Options) -> None:
    if block.get("cache_control") is not None:
        options.dropped.add("cache_control")


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
        if not isinstance(media, str) or media not in IMAGE_MEDIA_TYPES:
            known = ", ".join(sorted(IMAGE_MEDIA_TYPES))
            raise unsupported(
                f"{where}.media_type", f"'{_shown(media)}' is not a supported image type ({known})"
            )
        data = source.get("data")
        if not isinstance(data, str) or not data:
            raise invalid(f"{where}.data", "must be base64 text")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    raise unsupported(f"{where}.type", f"image source '{_shown(kind)}' is not translatable")


def _user_turn(content: list[Any], where: str, options: Options) -> list[dict[str, Any]]:
    """One user turn: its tool results become ``tool`` messages first, then the rest."""
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if isinstance(block, dict):
            _hints(block, options)
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append(image_part(block.get("source"), f"{at}.source", options.images))
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                raise invalid(f"{at}.tool_use_id", "is required")
            text = _text_of(block.get("content", ""), f"{at}.content", options)
            if block.get("is_error"):
                text = "[tool error] " + text  # docs/http-api.md: Chat has no error flag
            results.append({"role": "tool", "tool_call_id": call_id, "content": text})
        else:
            raise unsupported(f"{at}.type", f"content block '{_shown(kind)}' is not translatable")
    out = results
    if parts:
        only_text = all(p["type"] == "text" for p in parts)
        joined: Any = "\n".join(p["text"] for p in parts) if only_text else parts
        out.append({"role": "user", "content": joined})
    return out


def _assistant_turn(content: list[Any], where: str, options: Options) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if isinstance(block, dict):
            _hints(block, options)
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
        elif kind in _THINKING_BLOCKS:
            options.dropped.add("messages[] thinking blocks")
        else:
            raise unsupported(f"{at}.type", f"content block '{_shown(kind)}' is not translatable")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: Any, options: Options) -> tuple[list[dict[str, Any]], set[str]]:
    """Custom tools as Chat functions, and the names of the server tools left out."""
    if not isinstance(tools, list):
        raise invalid("tools", "must be an array")
    out: list[dict[str, Any]] = []
    left_out: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise invalid(f"tools[{i}]", "must be an object")
        name = tool.get("name")
        if not isinstance(name, str):
            raise invalid(f"tools[{i}].name", "is required")
        if tool.get("type") not in (None, "custom"):  # a server tool: the provider has none
            options.dropped.add("tools[] server tools")
            left_out.add(name)
            continue
        schema = tool.get("input_schema")
        if schema is not None and not isinstance(schema, dict):
            raise invalid(f"tools[{i}].input_schema", "must be an object")
        function: dict[str, Any] = {"name": name, "parameters": schema or {"type": "object"}}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        if isinstance(tool.get("strict"), bool):
            function["strict"] = tool["strict"]
        for key, value in tool.items():
            if key == "cache_control" and value is not None:
                options.dropped.add("cache_control")
            elif key == "defer_loading" and value is not None:
                options.dropped.add("tools[].defer_loading")
            elif key not in _TOOL_KEYS and key not in ("cache_control", "defer_loading"):
                options.dropped.add(f"tools[].{key}")
        out.append({"type": "function", "function": function})
    return out, left_out


def _tool_choice(choice: Any, chat: dict[str, Any], left_out: set[str]) -> None:
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
        if choice["name"] in left_out:  # R-XLATE-5: the answer would not be the one asked
            raise unsupported("tool_choice.name", "names a server tool this provider cannot run")
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise unsupported("tool_choice.type", f"'{_shown(kind)}' is not translatable")
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def _conversation(data: dict[str, Any], options: Options) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if "system" in data:
        system = _text_of(data["system"], "system", options)
        messages.append({"role": "system", "content": system})
    for i, msg in enumerate(data["messages"]):
        where = f"messages[{i}]"
        role = msg.get("role") if isinstance(msg, dict) else None
        if not isinstance(msg, dict) or role not in ("user", "assistant", "system"):
            raise invalid(f"{where}.role", "must be 'user', 'assistant' or 'system'")
        content = msg.get("content")
        if role == "system":  # R-XLATE-4: a Chat system message at that place
            messages.append({"role": "system", "content": _text_of(content, where, options)})
        elif isinstance(content, str):
            messages.append({"role": role, "content": content})
        elif not isinstance(content, list):
            raise invalid(f"{where}.content", "must be a string or an array of content blocks")
        elif role == "user":
            messages += _user_turn(content, where, options)
        else:
            messages.append(_assistant_turn(content, where, options))
    return messages


def _output_config(config: Any, chat: dict[str, Any], options: Options) -> None:
    """``output_config``: ``effort`` goes with thinking; ``format`` is structured output."""
    if not isinstance(config, dict):
        raise invalid("output_config", "must be an object")
    for key, value in config.items():
        if key == "effort" or value is None:
            continue
        if key != "format":
            options.dropped.add(f"output_config.{key}")
            continue
        kind = value.get("type") if isinstance(value, dict) else None
        if kind != "json_schema" or not isinstance(value.get("schema"), dict):
            raise unsupported("output_config.format", "must be a json_schema format")
        if not options.structured:  # R-XLATE-5: the answer's shape is what the client needs
            raise unsupported("output_config.format", "has no counterpart on this provider")
        schema = {"name": "output", "schema": value["schema"], "strict": True}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}


def chat_request(
    data: dict[str, Any], model: str, options: Options | None = None
) -> tuple[dict[str, Any], bool]:
    """An Anthropic Messages request as a Chat Completions request for ``model``, and whether
    the client wants the provider's reasoning back as thinking blocks."""
    options = options or Options()
    options.dropped.top_level(data, MESSAGES_TO_CHAT)
    chat: dict[str, Any] = {name: data[name] for name in _SAME if name in data}
    chat["model"] = model
    chat["messages"] = _conversation(data, options)
    stops = data.get("stop_sequences")
    if stops:
        if not isinstance(stops, list) or len(stops) > MAX_STOP_SEQUENCES:
            raise unsupported("stop_sequences", f"allows at most {MAX_STOP_SEQUENCES} here")
        chat["stop"] = stops
    left_out: set[str] = set()
    if data.get("tools"):
        tools, left_out = _tools(data["tools"], options)
        if tools:
            chat["tools"] = tools
    if "tool_choice" in data:
        _tool_choice(data["tool_choice"], chat, left_out)
    metadata = data.get("metadata")
    if isinstance(metadata, dict):
        if isinstance(metadata.get("user_id"), str):
            chat["user"] = metadata["user_id"]
        if any(key != "user_id" for key in metadata):
            options.dropped.add("metadata")
    if data.get("output_config") is not None:
        _output_config(data["output_config"], chat, options)
    switch, shown = messages_switch(data)
    switch.apply(chat, options.thinking, options.dropped)
    if data.get("stream"):
        chat["stream_options"] = {"include_usage": True}  # usage for message_delta
    return chat, shown


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
    """Chat usage as Messages usage: cached prompt tokens are ``cache_read_input_tokens``,
    apart from ``input_tokens`` as the Messages API counts them."""
    usage = chat_usage if isinstance(chat_usage, dict) else {}
    prompt = _count(usage.get("prompt_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = min(_count(details.get("cached_tokens")), prompt) if isinstance(details, dict) else 0
    out = {"input_tokens": prompt - cached, "output_tokens": _count(usage.get("completion_tokens"))}
    if cached:
        out["cache_read_input_tokens"] = cached
    return out


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def message_id(chat_id: Any) -> str:
    text = str(chat_id or int(time.time() * 1000))
    return text if text.startswith("msg_") else "msg_" + text


def messages_response(body: str, thinking: bool = False) -> str:
    """A Chat Completions answer as an Anthropic ``message``; the provider's reasoning text
    as a ``thinking`` block first when the client asked for ``thinking``."""
    data, choice, message = chat_answer(body)
    content: list[dict[str, Any]] = []
    reasoning = reasoning_text(message)
    if thinking and reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
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
