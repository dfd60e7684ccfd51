"""Responses client, Chat Completions provider: the request and the whole answer.

Field table: docs/http-api.md, "Translation". What has no counterpart is refused naming the
field (R-XLATE-2): stored state (``previous_response_id``, ``store: true``), built-in tools,
reasoning settings, files.
"""

from __future__ import annotations

import time
from typing import Any

from pool.translate.chat_chunks import chat_answer
from pool.translate.common import dumps, invalid, named_tools, unsupported
from pool.translate.messages_via_chat import check_image

_SAME = ("temperature", "top_p", "parallel_tool_calls", "user", "stream")
_KNOWN = frozenset(
    {*_SAME, "model", "input", "instructions", "max_output_tokens", "tools", "tool_choice"}
    | {"text", "store", "metadata"}
)
# Fields of the request the Response object repeats back (the SDK reads them from it).
_ECHOED = ("instructions", "temperature", "top_p", "parallel_tool_calls", "tool_choice", "tools")
_ECHOED_DEFAULTS: dict[str, Any] = {
    "instructions": None,
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "metadata": {},
}


def _parts(content: Any, where: str, images: str = "all") -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(where, "must be a string or an array of content parts")
    out: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
            out.append({"type": "text", "text": part["text"]})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str) or not url.startswith(
                ("https://", "http://", "data:image/")
            ):
                raise unsupported(f"{at}.image_url", "must be an http(s) URL or an image data URL")
            check_image(images, not url.startswith("data:"), f"{at}.image_url")
            image: dict[str, Any] = {"url": url}
            if part.get("detail") in ("low", "high", "auto"):
                image["detail"] = part["detail"]
            out.append({"type": "image_url", "image_url": image})
        else:
            raise unsupported(f"{at}.type", f"content part '{kind}' is not translatable")
    if all(p["type"] == "text" for p in out):
        return "".join(p["text"] for p in out)
    return out


def _messages(items: Any, images: str) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise invalid("input", "must be a string or a non-empty array of input items")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(where, "must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise invalid(f"{where}.role", "must be user, assistant, system or developer")
            content = _parts(item.get("content"), f"{where}.content", images)
            if role == "assistant" and not isinstance(content, str):
                raise unsupported(f"{where}.content", "of an assistant turn must be text")
            messages.append({"role": role, "content": content})
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id", "")),
                "type": "function",
                "function": {
                    "name": str(item.get("name", "")),
                    "arguments": str(item.get("arguments", "")),
                },
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)  # parallel calls: one assistant turn
            elif last is not None and last["role"] == "assistant" and "tool_calls" not in last:
                last["tool_calls"] = [call]
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                output = _parts(output, f"{where}.output")
                if not isinstance(output, str):
                    raise unsupported(f"{where}.output", "must be text")
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise invalid(f"{where}.call_id", "is required")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        else:
            raise unsupported(f"{where}.type", f"input item '{kind}' is not translatable")
    return messages


def _tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for tool in named_tools(tools, ("function",), "built-in tool"):
        fn = {
            k: tool[k]
            for k in ("name", "description", "parameters", "strict")
            if tool.get(k) is not None
        }
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("name"), str)
    ):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise unsupported("tool_choice", "is not translatable")


def _format(text: Any) -> dict[str, Any] | None:
    if not isinstance(text, dict):
        raise invalid("text", "must be an object")
    for name in text:
        if name != "format":
            raise unsupported(f"text.{name}")
    fmt = text.get("format") or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise unsupported("text.format.type", f"'{kind}' is not translatable")


def chat_request(data: dict[str, Any], model: str, images: str = "all") -> dict[str, Any]:
    """A Responses request as a Chat Completions request for ``model``; ``images`` says
    which images the provider takes (``messages_via_chat.images_for``)."""
    for name in data:
        if name not in _KNOWN:
            raise unsupported(name)
    if data.get("store"):
        raise unsupported("store", "(stored responses) has no counterpart; send store: false")
    chat: dict[str, Any] = {name: data[name] for name in _SAME if data.get(name) is not None}
    chat["model"] = model
    messages = _messages(data.get("input"), images)
    if isinstance(data.get("instructions"), str):
        messages.insert(0, {"role": "system", "content": data["instructions"]})
    chat["messages"] = messages
    if isinstance(data.get("max_output_tokens"), int):
        chat["max_tokens"] = data["max_output_tokens"]
    if data.get("tools"):
        chat["tools"] = _tools(data["tools"])
    if data.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(data["tool_choice"])
    if data.get("text") is not None and (fmt := _format(data["text"])) is not None:
        chat["response_format"] = fmt
    if data.get("stream"):
        chat["stream_options"] = {"include_usage": True}
    return chat


def echo_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The request fields a Response repeats, with the API's defaults."""
    out = dict(_ECHOED_DEFAULTS)
    out.update({k: data[k] for k in _ECHOED if data.get(k) is not None})
    if isinstance(data.get("metadata"), dict):
        out["metadata"] = data["metadata"]
    out["max_output_tokens"] = data.get("max_output_tokens")
    return out


def response_usage(usage: Any) -> dict[str, Any]:
    raw = usage if isinstance(usage, dict) else {}
    prompt = int(raw.get("prompt_tokens") or 0)
    completion = int(raw.get("completion_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [content] if status == "completed" else [],
    }


def call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {
        "id": "fc_" + call_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def response_object(
    response_id: str,
    model: str,
    created: int,
    echo: dict[str, Any],
    output: list[dict[str, Any]],
    finish: str | None,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """A Response; ``finish`` None means in progress."""
    status, incomplete = "completed", None
    if finish is None:
        status = "in_progress"
    elif finish == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    elif finish == "content_filter":
        status, incomplete = "incomplete", {"reason": "content_filter"}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "model": model,
        "output": output,
        "usage": usage,
        "text": {"format": {"type": "text"}},
        "store": False,
        **echo,
    }


def response_id(chat_id: Any) -> str:
    return "resp_" + str(chat_id or int(time.time() * 1000)).removeprefix("chatcmpl-")


def responses_response(body: str, echo: dict[str, Any]) -> str:
    """A Chat Completions answer as a Response."""
    data, choice, message = chat_answer(body)
    rid = response_id(data.get("id"))
    output: list[dict[str, Any]] = []
    if isinstance(message.get("content"), str) and message["content"]:
        output.append(message_item("msg_" + rid.removeprefix("resp_"), message["content"]))
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        output.append(
            call_item(
                str(call.get("id", "")), str(fn.get("name", "")), str(fn.get("arguments", ""))
            )
        )
    created = int(data.get("created") or time.time())
    finish = str(choice.get("finish_reason") or "stop")
    usage = response_usage(data.get("usage"))
    return dumps(
        response_object(rid, str(data.get("model", "")), created, echo, output, finish, usage)
    )
