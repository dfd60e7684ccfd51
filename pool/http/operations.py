"""What a request is: its operation, the capabilities it needs, its context class and the
exact body sent upstream (R-PROF-4, R-PROF-5, R-POOL-7, R-CFG-2, R-CFG-11).

The body is parsed once; the upstream body is encoded once, after the pool picked the
provider, because only then is the served model name known.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from catalog.config import EdgeSnapshot, ProviderSpec
from pool.http.errors import HttpError

# Fields that would let a caller choose the upstream or carry a provider key in the body:
# never passed through (the URL comes only from the provider's profile, R-PROF-6).
FORBIDDEN_FIELDS = ("api_base", "base_url", "api_key")
BYTES_PER_TOKEN = 4
# R-IN-3, docs/http-api.md: arrays and objects nested deeper are refused. The parser follows
# nearly as deep as the interpreter's recursion limit, but the body is encoded again for the
# Node further down the call stack, where that limit comes sooner: a fixed bound far below.
MAX_NESTING = 128
TOO_DEEP = f"the request body is nested too deeply (at most {MAX_NESTING} levels)"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One POST endpoint: its wire operation, the capability it needs and its error shape."""

    operation: str  # the Node operation: chat_completions | responses | messages | count_tokens
    capability: str  # R-PROF-4 capability that admits a provider for it
    anthropic: bool  # Anthropic error shape and x-api-key auth
    streamable: bool
    list_field: str | None  # a field that must be a non-empty JSON array
    required_int: str | None = None  # a field that must be an integer


ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": Endpoint("chat_completions", "chat", False, True, "messages"),
    "/v1/responses": Endpoint("responses", "responses", False, True, None),
    "/v1/messages": Endpoint("messages", "messages", True, True, "messages", "max_tokens"),
    "/v1/messages/count_tokens": Endpoint("count_tokens", "count_tokens", True, False, "messages"),
}

_NEEDS: dict[tuple[str, bool, bool], frozenset[str]] = {}


def needs_for(capability: str, stream: bool, tools: bool) -> frozenset[str]:
    """R-PROF-4: the capability set a request needs (shared frozensets: pool keys stay cheap)."""
    key = (capability, stream, tools)
    found = _NEEDS.get(key)
    if found is None:
        names = {capability}
        if stream:
            names.add("streaming")
        if tools:
            names.add("tool_calling")
        found = _NEEDS[key] = frozenset(names)
    return found


def estimate_tokens(body: bytes, data: Any = None) -> int:
    """The documented input-token estimate (docs/http-api.md, R-IN-4): one token per 4 bytes
    of the request body, except that each image, audio or file part counts
    ``BINARY_PART_TOKENS`` instead of its base64 length.

    Deliberately cheap and on the high side (JSON punctuation counts too), so a request
    near the threshold is treated as long rather than overrunning a normal slot (R-POOL-7).
    """
    if data is None or not any(marker in body for marker in _BINARY_MARKERS):
        return (len(body) + BYTES_PER_TOKEN - 1) // BYTES_PER_TOKEN
    binary_chars, parts = binary_parts(data)
    text_bytes = max(len(body) - binary_chars, 0)
    return (text_bytes + BYTES_PER_TOKEN - 1) // BYTES_PER_TOKEN + parts * BINARY_PART_TOKENS


BINARY_PART_TOKENS = 1024  # the fixed admission cost of one image, audio or file part
# Content parts that carry binary data, in the Chat Completions, Responses and Messages APIs.
BINARY_PART_TYPES = frozenset(
    {"image_url", "image", "input_image", "input_audio", "input_file", "file", "document"}
)
# No binary part without one of these in the body: the walk is skipped (the common case).
_BINARY_MARKERS = (b"data:", b"image", b"audio", b"file", b"document")


def binary_parts(data: Any) -> tuple[int, int]:
    """(characters of binary payload, number of binary parts) in a decoded request.

    A part is a dict whose ``type`` is a string in ``BINARY_PART_TYPES`` (all its strings
    count as payload), or else any ``data:`` URL string. Iterative: the depth is the
    decoder's. R-IN-7: any JSON shape is walked; a ``type`` may be an object (a tool schema's
    property named ``type``) and is then an ordinary member.
    """
    chars = parts = 0
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            kind = value.get("type")
            if isinstance(kind, str) and kind in BINARY_PART_TYPES:
                parts += 1
                chars += _string_chars(value)
            else:
                stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str) and value.startswith("data:") and len(value) > 64:
            parts += 1
            chars += len(value)
    return chars, parts


def _string_chars(data: Any) -> int:
    total = 0
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            total += len(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return total


@dataclass(slots=True)
class ParsedRequest:
    endpoint: Endpoint
    data: dict[str, Any]
    model: str
    stream: bool
    needs: frozenset[str]
    input_tokens_estimate: int
    body_bytes: int = 0  # the request body's size: the ingress snapshot's (R-SEG-6)
    asked: str = ""  # R-FALL-1: the caller's model when a fallback group (``model``) serves it
    headers: Mapping[bytes, bytes] | None = None  # the client's (R-XLATE-6: client_headers)

    @property
    def name(self) -> str:
        """The model name the caller asked for: answers carry it (docs/http-api.md)."""
        return self.asked or self.model


def _invalid(message: str, param: str | None = None) -> HttpError:
    return HttpError("invalid_request", message, param)


def parse_request(endpoint: Endpoint, body: bytes) -> ParsedRequest:
    """Decode and check the fields the Edge relies on; ``invalid_request`` names the field."""
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError:  # also invalid UTF-8
        raise _invalid("the request body is not valid JSON") from None
    except RecursionError:  # R-IN-3: msgspec raises this, not DecodeError, on deep nesting
        raise _invalid(TOO_DEEP) from None
    if not isinstance(data, dict):
        raise _invalid("the request body must be a JSON object")
    if nested_deeper_than(MAX_NESTING, body, data):
        raise _invalid(TOO_DEEP)
    for name in FORBIDDEN_FIELDS:
        if name in data:
            raise _invalid(f"'{name}' is not accepted: the upstream is chosen by the model", name)
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("'model' is required and must be a non-empty string", "model")
    stream = data.get("stream", False)
    if stream is None:
        stream = False
    elif not isinstance(stream, bool):
        raise _invalid("'stream' must be a boolean", "stream")
    if not endpoint.streamable:
        stream = False
    field = endpoint.list_field
    if field is not None:
        value = data.get(field)
        if not isinstance(value, list) or not value:
            raise _invalid(f"'{field}' is required and must be a non-empty array", field)
    if endpoint.required_int is not None and not _is_int(data.get(endpoint.required_int)):
        name = endpoint.required_int
        raise _invalid(f"'{name}' is required and must be an integer", name)
    tools = data.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _invalid("'tools' must be an array", "tools")
    options = data.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _invalid("'stream_options' must be an object", "stream_options")
    uses_tools = bool(tools) or bool(data.get("functions"))
    return ParsedRequest(
        endpoint=endpoint,
        data=data,
        model=model,
        stream=stream,
        needs=needs_for(endpoint.capability, stream, uses_tools),
        input_tokens_estimate=estimate_tokens(body, data),
        body_bytes=len(body),
    )


def nested_deeper_than(levels: int, body: bytes, data: Any) -> bool:
    """Whether arrays and objects in ``data`` (decoded from ``body``) nest more than ``levels``
    deep, the top level being 1. A body with no more brackets than that cannot: only the rare
    other one is walked (iteratively, containers only)."""
    if body.count(b"[") + body.count(b"{") <= levels:
        return False
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > levels:
            return True
        children = value.values() if isinstance(value, dict) else value
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Target:
    """How one provider runs one model group."""

    model: str  # the upstream ``model`` value
    tunnel: bool  # OpenAI-compatible passthrough (TunnelRequest) vs normalized (RunRequest)
    chat_usage_option: bool  # openai_chat driver: streams report usage only when asked
    silence_s: float = 600.0  # no output from the Node for this long: the run is abandoned
    translate: bool = False  # the group serves operations the driver lacks (R-XLATE-1)
    capabilities: frozenset[str] = frozenset()  # the profile's own (native) capabilities
    driver: str = ""  # the profile's driver: which images a translation can pass on
    thinking: str = "none"  # the profile's reasoning switch for translation (R-XLATE-4)
    refuse_dropped: bool = False  # translate: {unsupported: refuse} (R-XLATE-5)
    # R-XLATE-6: the client headers a native path passes on (anthropic-beta), by name
    client_headers: tuple[bytes, ...] = ()


def build_targets(snapshot: EdgeSnapshot) -> dict[tuple[str, str], Target]:
    """(model group, provider id) -> Target, for every mapping in the catalog.

    The upstream model is the served name the catalog gives the provider for the group
    (R-CFG-2; the catalog is the source of truth, R-CFG-11), passed once through the
    provider profile's ``model_mapping`` (R-PROF-5). The external key itself never goes
    upstream unless the catalog names it as the served model.
    """
    targets: dict[tuple[str, str], Target] = {}
    for group in snapshot.models.values():
        for provider_id, served in group.providers.items():
            spec = snapshot.providers.get(provider_id)
            if spec is None:
                continue
            profile = spec.profile
            targets[(group.id, provider_id)] = Target(
                model=profile.map_model(served),
                tunnel=profile.adapter == "openai_compat",
                chat_usage_option=profile.driver == "openai_chat",
                silence_s=silence_limit(spec),
                translate=group.translate,
                capabilities=profile.capabilities,
                driver=profile.driver,
                thinking=profile.thinking(),
                refuse_dropped=group.refuse_dropped,
                client_headers=CLIENT_HEADERS.get(profile.driver, ()),
            )
    return targets


# R-XLATE-6: headers of the client's own API that a native upstream needs to honour the
# client's fields (the Messages API's beta flags enable `thinking: adaptive`,
# `context_management`, ...); passed on unchanged, bounded (``client_headers``).
CLIENT_HEADERS: dict[str, tuple[bytes, ...]] = {"anthropic_messages": (b"anthropic-beta",)}
MAX_CLIENT_HEADER_CHARS = 1024
_HEADER_VALUE_CHARS = frozenset(range(0x20, 0x7F))


def client_headers(
    target: Target, headers: Mapping[bytes, bytes] | None
) -> tuple[tuple[str, str], ...]:
    """The client's own API headers a native run of ``target`` passes upstream: printable
    ASCII up to ``MAX_CLIENT_HEADER_CHARS``; anything else is not passed."""
    if not headers:
        return ()
    out = []
    for name in target.client_headers:
        value = headers.get(name)
        if (
            value
            and len(value) <= MAX_CLIENT_HEADER_CHARS
            and _HEADER_VALUE_CHARS.issuperset(value)
        ):
            out.append((name.decode(), value.decode()))
    return tuple(out)


NODE_SILENCE_GRACE_S = 30.0


def silence_limit(spec: ProviderSpec) -> float:
    """How long the Edge waits for a run's next output before it gives up on the Node.

    The Node enforces the provider's own first-byte and idle timeouts (or a CLI run's whole
    timeout) and then ends the run; this is the Edge's backstop for a Node that never sends
    the terminal event (R-POOL-9), so it is the Node's limit plus a grace.
    """
    if spec.profile.adapter == "cli" and spec.run_timeout_ms:
        limit_ms = spec.run_timeout_ms
    else:
        limit_ms = max(spec.first_byte_timeout_ms, spec.idle_timeout_ms)
    return limit_ms / 1000 + NODE_SILENCE_GRACE_S


def upstream_body(request: ParsedRequest, target: Target) -> bytes:
    """The body sent to the Node: the caller's JSON with ``model`` set to the served target.

    An openai_chat stream also gets ``stream_options.include_usage`` so its usage can be
    metered; the caller then sees the final usage chunk that option defines.
    """
    data = request.data
    data["model"] = target.model
    if (
        request.stream
        and target.chat_usage_option
        and request.endpoint.operation == "chat_completions"
    ):
        options = data.get("stream_options")
        data["stream_options"] = (
            {**options, "include_usage": True} if options else {"include_usage": True}
        )
    return msgspec.json.encode(data)
