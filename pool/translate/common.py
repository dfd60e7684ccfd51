"""What every translator shares: its errors, JSON/SSE encoding and an incremental SSE reader.

Pure and I/O-free (docs/http-api.md, "Translation"): text in, text out.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import msgspec

MAX_EVENT_CHARS = 16 * 1024 * 1024  # a longer SSE event is not one we can translate
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


class TranslationError(Exception):
    """A request or answer that cannot be translated faithfully.

    ``code`` is a row of the HTTP error table: ``unsupported_operation`` for a field with no
    counterpart (R-XLATE-2, ``param`` names it), ``invalid_request`` for malformed input,
    ``upstream_error`` for a provider answer that cannot be carried over.
    """

    def __init__(
        self, message: str, param: str | None = None, code: str = "unsupported_operation"
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def unsupported(param: str, why: str = "has no counterpart on this model's provider") -> Exception:
    return TranslationError(f"'{param}' {why}", param)


def invalid(param: str, why: str) -> Exception:
    return TranslationError(f"'{param}' {why}", param, "invalid_request")


def upstream(why: str) -> Exception:
    return TranslationError(why, None, "upstream_error")


def named_tools(tools: Any, types: tuple[str | None, ...], what: str) -> Iterator[dict[str, Any]]:
    """Each entry of a request's ``tools``, checked: one of ``types`` and a string ``name``."""
    if not isinstance(tools, list):
        raise invalid("tools", "must be an array")
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or kind not in types:
            raise unsupported(f"tools[{i}].type", f"{what} '{kind}' is not translatable")
        if not isinstance(tool.get("name"), str):
            raise invalid(f"tools[{i}].name", "is required")
        yield tool


def dumps(obj: Any) -> str:
    """Compact JSON; U+2028/U+2029 escaped so line-based SSE readers keep the event whole."""
    text = _encode(obj).decode()
    if "\u2028" in text or "\u2029" in text:
        text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return text


def loads(text: str | bytes) -> Any:
    return _decode(text)


def data_event(obj: Any) -> str:
    return "data: " + dumps(obj) + "\n\n"


def named_event(name: str, obj: Any) -> str:
    return "event: " + name + "\ndata: " + dumps(obj) + "\n\n"


DONE_EVENT = "data: [DONE]\n\n"


class SseReader:
    """Splits relayed SSE text into the ``data`` payloads of complete events.

    Lines end at ``\\n`` (a trailing ``\\r`` is dropped); comments and ``event:``/``id:``
    lines are skipped: every API translated here names its event type inside the data.
    """

    __slots__ = ("_data", "_pending", "_size")

    def __init__(self) -> None:
        self._pending = ""
        self._data: list[str] = []
        self._size = 0

    def feed(self, text: str) -> list[str]:
        lines = (self._pending + text).split("\n")
        self._pending = lines.pop()
        if len(self._pending) > MAX_EVENT_CHARS:
            raise upstream("the provider sent an SSE line longer than the translator accepts")
        out: list[str] = []
        for line in lines:
            if line.endswith("\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    out.append("\n".join(self._data))
                    self._data, self._size = [], 0
            elif line.startswith("data:"):
                value = line[6:] if line.startswith("data: ") else line[5:]
                self._size += len(value)
                if self._size > MAX_EVENT_CHARS:
                    raise upstream("the provider sent an SSE event larger than accepted")
                self._data.append(value)
        return out

    def flush(self) -> list[str]:
        """The last event when the stream ended without its blank line."""
        out = self.feed("\n\n") if self._pending or self._data else []
        return out


def json_event(data: str) -> dict[str, Any] | None:
    """One event's JSON object; None for ``[DONE]``; a provider error for anything else."""
    if data == "[DONE]":
        return None
    try:
        obj = loads(data)
    except msgspec.DecodeError:
        raise upstream("the provider sent a stream event that is not JSON") from None
    if not isinstance(obj, dict):
        raise upstream("the provider sent a stream event that is not a JSON object")
    return obj


def error_text(obj: dict[str, Any]) -> str:
    """The message of an in-band error event of any of the three APIs."""
    err = obj.get("error")
    message = err.get("message") if isinstance(err, dict) else err
    if not isinstance(message, str) or not message:
        message = str(obj.get("message") or "unknown error")
    return "the provider reported an error mid-stream: " + message[:300]


class SseTranslator:
    """The shared frame of the stream translators: complete upstream events go to
    ``_event`` until the translator is done; ``close`` at the upstream's end calls ``_end``."""

    def __init__(self) -> None:
        self._reader = SseReader()
        self._done = False

    def feed(self, text: str) -> str:
        return self._run(self._reader.feed(text))

    def close(self) -> str:
        out = self._run(self._reader.flush())
        if self._done:
            return out
        tail: list[str] = []
        self._end(tail)
        return out + "".join(tail)

    def _run(self, events: list[str]) -> str:
        out: list[str] = []
        for data in events:
            if self._done:
                break
            self._event(data, out)
        return "".join(out)

    def _event(self, data: str, out: list[str]) -> None:
        raise NotImplementedError

    def _end(self, out: list[str]) -> None:
        """The upstream stream ended before the translator was done."""
        raise upstream("the provider's stream ended before its stop event")

    def failed(self, code: str, message: str) -> str | None:
        """The event that ends this stream after a failure, in the client's protocol; None
        when the client API's own error event is the right end (Chat, Messages)."""
        return None


class StreamTranslator(Protocol):
    """Upstream SSE text in, client SSE text out; ``close`` at the upstream's normal end.

    Both raise ``TranslationError`` when the stream cannot go on (an in-band provider error,
    an answer that cannot be carried over, a stream that ended before its stop event).
    """

    def feed(self, text: str) -> str: ...

    def close(self) -> str: ...

    def failed(self, code: str, message: str) -> str | None: ...


class WholeTranslator(Protocol):
    """A non-stream answer: the provider's body in, the client's body out."""

    def __call__(self, body: str) -> str: ...
