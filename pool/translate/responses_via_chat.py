"""Responses client, Chat Completions provider: the request and the whole answer.

Field table: ``pool/translate/fields.py`` (docs/http-api.md, "Translation"): stored state
(``previous_response_id``, ``store: true``) is refused, built-in tools the provider cannot run
are left out, reasoning goes to the provider's own switch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pool.translate.chat_chunks import chat_answer, reasoning_text
from pool.translate.common import dumps, invalid, unsupported
from pool.translate.fields import RESPONSES_TO_CHAT, Options
from pool.translate.messages_via_chat import check_image
from pool.translate.reasoning import responses_switch

_SAME = (
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "user",
    "stream",
    "prompt_cache_key",
    "safety_identifier",
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
NAMESPACE_SEPARATOR = "__"  # a namespace tool's function is ``<namespace>__<name>`` upstream
_FUNCTION_KEYS = ("name", "description", "parameters", "strict")


@dataclass(slots=True)
class Answering:
    """What the answer's translator needs of the request: the fields a Response repeats,
    the namespaced functions by their upstream name, and whether a reasoning summary is
    wanted."""

    echo: dict[str, Any] = field(default_factory=dict)
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    summary: bool = False

    def call_name(self, upstream: str) -> tuple[str, str | None]:
        """A provider's function name as (name, namespace) for a ``function_call`` item."""
        found = self.namespaced.get(upstream)
        return (found[1], found[0]) if found else (upstream, None)


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
            kind_text = kind if isinstance(kind, str) else type(kind).__name__
            raise unsupported(f"{at}.type", f"content part '{kind_text}' is not translatable")
    if all(p["type"] == "text" for p in out):
        return "".join(p["text"] for p in out)
    return out


def _call(item: dict[str, Any]) -> dict[str, Any]:
    name = str(item.get("name", ""))
    namespace = item.get("namespace")
    if isinstance(namespace, str) and namespace:
        name = namespace + NAMESPACE_SEPARATOR + name
    return {
        "id": str(item.get("call_id", "")),
        "type": "function",
        "function": {"name": name, "arguments": str(item.get("arguments", ""))},
    }


def _messages(items: Any, options: Options) -> list[dict[str, Any]]:
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
            content = _parts(item.get("content"), f"{where}.content", options.images)
            if role == "assistant" and not isinstance(content, str):
                raise unsupported(f"{where}.content", "of an assistant turn must be text")
            messages.append({"role": role, "content": content})
        elif kind == "function_call":
            call = _call(item)
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
        elif kind == "reasoning":
            options.dropped.add("input[] reasoning items")
        else:
            kind_text = kind if isinstance(kind, str) else type(kind).__name__
            raise unsupported(f"{where}.type", f"input item '{kind_text}' is not translatable")
    return messages


def _function(tool: dict[str, Any], where: str, name: str) -> dict[str, Any]:
    if not isinstance(tool.get("name"), str):
        raise invalid(f"{where}.name", "is required")
    fn = {k: tool[k] for k in _FUNCTION_KEYS if tool.get(k) is not None}
    fn["name"] = name
    return {"type": "function", "function": fn}


def _tools(tools: Any, options: Options, answering: Answering) -> tuple[list[Any], set[str]]:
    """Function tools, and each ``namespace`` tool's functions as ``NS__name``; the names of
    the built-in tools left out (the provider cannot run them)."""
    if not isinstance(tools, list):
        raise invalid("tools", "must be an array")
    out: list[dict[str, Any]] = []
    left_out: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(tool, dict):
            raise invalid(where, "must be an object")
        if kind == "function":
            out.append(_function(tool, where, str(tool.get("name"))))
        elif kind == "namespace":
            namespace, inner = tool.get("name"), tool.get("tools")
            if not isinstance(namespace, str) or not isinstance(inner, list):
                raise invalid(where, "must have a name and an array of tools")
            for j, member in enumerate(inner):
                if not isinstance(member, dict) or member.get("type") != "function":
                    options.dropped.add("tools[] built-in tools")
                    continue
                upstream = namespace + NAMESPACE_SEPARATOR + str(member.get("name"))
                out.append(_function(member, f"{where}.tools[{j}]", upstream))
                answering.namespaced[upstream] = (namespace, str(member["name"]))
        else:  # web_search, file_search, code_interpreter, computer_use, custom, mcp, ...
            options.dropped.add("tools[] built-in tools")
            left_out.add(kind if isinstance(kind, str) else "")
    return out, left_out


def _tool_choice(choice: Any, left_out: set[str]) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    if isinstance(kind, str) and kind in left_out:  # R-XLATE-5: never silently another answer
        raise unsupported("tool_choice", "names a built-in tool this provider cannot run")
    raise unsupported("tool_choice", "is not translatable")


def _format(text: Any, options: Options) -> dict[str, Any] | None:
    if not isinstance(text, dict):
        raise invalid("text", "must be an object")
    for name, value in text.items():
        if name != "format" and value is not None:
            options.dropped.add("text.verbosity" if name == "verbosity" else f"text.{name}")
    fmt = text.get("format") or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind in ("json_object", "json_schema") and not options.structured:
        raise unsupported("text.format", "has no counterpart on this provider (plain text only)")
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    kind_text = kind if isinstance(kind, str) else type(kind).__name__
    raise unsupported("text.format.type", f"'{kind_text}' is not translatable")


def chat_request(
    data: dict[str, Any], model: str, options: Options | None = None
) -> tuple[dict[str, Any], Answering]:
    """A Responses request as a Chat Completions request for ``model``, and what its
    answer's translation needs."""
    options = options or Options()
    options.dropped.top_level(data, RESPONSES_TO_CHAT)
    if data.get("store"):
        raise unsupported("store", "(stored responses) has no counterpart; send store: false")
    answering = Answering(echo=echo_fields(data))
    chat: dict[str, Any] = {name: data[name] for name in _SAME if data.get(name) is not None}
    chat["model"] = model
    messages = _messages(data.get("input"), options)
    if isinstance(data.get("instructions"), str):
        messages.insert(0, {"role": "system", "content": data["instructions"]})
    chat["messages"] = messages
    if isinstance(data.get("max_output_tokens"), int):
        chat["max_tokens"] = data["max_output_tokens"]
    left_out: set[str] = set()
    if data.get("tools"):
        tools, left_out = _tools(data["tools"], options, answering)
        if tools:
            chat["tools"] = tools
    if data.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(data["tool_choice"], left_out)
    if "tools" not in chat:  # Chat refuses these without tools
        chat.pop("parallel_tool_calls", None)
        if chat.pop("tool_choice", None) == "required":
            raise unsupported("tool_choice", "requires a tool, and no tool can be sent")
    if data.get("text") is not None and (fmt := _format(data["text"], options)) is not None:
        chat["response_format"] = fmt
    switch, answering.summary = responses_switch(data)
    switch.apply(chat, options.thinking, options.dropped)
    if data.get("stream"):
        chat["stream_options"] = {"include_usage": True}
    return chat, answering


def echo_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The request fields a Response repeats, with the API's defaults."""
    out = dict(_ECHOED_DEFAULTS)
    out.update({k: data[k] for k in _ECHOED if data.get(k) is not None})
    if isinstance(data.get("metadata"), dict):
        out["metadata"] = data["metadata"]
    out["max_output_tokens"] = data.get("max_output_tokens")
    return out


def response_usage(usage: Any) -> dict[str, Any]:
    """Chat usage as Responses usage, with cached and reasoning tokens where reported."""
    raw = usage if isinstance(usage, dict) else {}
    prompt = _count(raw.get("prompt_tokens"))
    completion = _count(raw.get("completion_tokens"))
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": _detail(raw, "prompt", "cached_tokens")},
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": _detail(raw, "completion", "reasoning_tokens")
        },
        "total_tokens": prompt + completion,
    }


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _detail(usage: dict[str, Any], side: str, name: str) -> int:
    details = usage.get(f"{side}_tokens_details")
    return _count(details.get(name)) if isinstance(details, dict) else 0


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [content] if status == "completed" else [],
    }


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    """A ``reasoning`` item whose summary is the provider's reasoning text."""
    summary = [{"type": "summary_text", "text": text}] if text else []
    return {"id": item_id, "type": "reasoning", "summary": summary}


def call_item(
    call_id: str,
    name: str,
    arguments: str,
    status: str = "completed",
    namespace: str | None = None,
) -> dict[str, Any]:
    item = {
        "id": "fc_" + call_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
    if namespace is not None:
        item["namespace"] = namespace
    return item


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


def responses_response(body: str, answering: Answering) -> str:
    """A Chat Completions answer as a Response."""
    data, choice, message = chat_answer(body)
    rid = response_id(data.get("id"))
    output: list[dict[str, Any]] = []
    reasoning = reasoning_text(message)
    if answering.summary and reasoning:
        output.append(reasoning_item("rs_" + rid.removeprefix("resp_"), reasoning))
    if isinstance(message.get("content"), str) and message["content"]:
        output.append(message_item("msg_" + rid.removeprefix("resp_"), message["content"]))
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        name, namespace = answering.call_name(str(fn.get("name", "")))
        output.append(
            call_item(
                str(call.get("id", "")), name, str(fn.get("arguments", "")), namespace=namespace
            )
        )
    created = int(data.get("created") or time.time())
    finish = str(choice.get("finish_reason") or "stop")
    usage = response_usage(data.get("usage"))
    model = str(data.get("model", ""))
    return dumps(response_object(rid, model, created, answering.echo, output, finish, usage))
