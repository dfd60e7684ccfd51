"""The gate on a streamed Chat Completion: SSE text in, gated SSE text out (R-SEG-5, R-SEG-6).

Pure: the relay feeds the Node's output as it comes and sends what ``feed`` returns.
Content deltas go through the filter pipeline and leave as new chunks carrying the
released text; role and other events pass at once; a tool call, a finish reason, a usage
chunk and ``[DONE]`` go out after the held text is flushed (so the order is the upstream's).
After a recovery the new attempt's role delta is dropped: the client already has it. Every
chunk leaves with the first attempt's ``id``, ``created`` and ``model``, so after a recovery
the client still sees one stream with one id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from .pipeline import FilterPipeline, GateVerdict

MAX_EVENT_CHARS = 4 * 1024 * 1024  # one SSE event larger than this is not relayed whole
DONE = "data: [DONE]\n\n"
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


class SseSplitter:
    """Cuts SSE text into whole events (``\\n\\n`` or ``\\r\\n\\r\\n`` ends one)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = ""

    def feed(self, text: str) -> list[str]:
        buf = self._buf + text
        if "\r" in buf:
            buf = buf.replace("\r\n", "\n")
        *events, self._buf = buf.split("\n\n")
        if len(self._buf) > MAX_EVENT_CHARS:
            raise ValueError("an SSE event from the upstream is too large")
        return [e for e in events if e.strip()]

    def rest(self) -> str:
        rest, self._buf = self._buf, ""
        return rest if rest.strip() else ""


@dataclass(slots=True)
class Identity:
    """What every chunk the client sees carries: one id, one created time, one model."""

    id: str | None = None
    created: int | None = None
    model: str | None = None


@dataclass(slots=True)
class GatedChat:
    """One request's gated chat stream, across every attempt of its recovery."""

    pipeline: FilterPipeline
    model: str  # the model name the client asked for
    identity: Identity = field(default_factory=Identity)
    delivered: list[str] = field(default_factory=list)  # content the client has received
    fired: GateVerdict | None = None
    observed: GateVerdict | None = None
    attempts: int = 1
    done: bool = False  # ``[DONE]`` went out: a client may stop reading here
    _splitter: SseSplitter = field(default_factory=SseSplitter)

    def restart(self, pipeline: FilterPipeline) -> None:
        """A new attempt: a fresh window and splitter; identity and delivered text stay."""
        self.pipeline = pipeline
        self.fired = None
        self.attempts += 1
        self._splitter = SseSplitter()

    @property
    def delivered_text(self) -> str:
        return "".join(self.delivered)

    def feed(self, text: str) -> str:
        """SSE text from the Node -> SSE text for the client ("" while held or once fired)."""
        out: list[str] = []
        for event in self._splitter.feed(text):
            if self.fired is not None:
                break
            self._event(event, out)
        return "".join(out)

    def end(self) -> str:
        """The Node ended the run normally: flush what is held (a fire here still counts)."""
        out: list[str] = []
        rest = self._splitter.rest()
        if rest and self.fired is None:
            self._event(rest, out)
        if self.fired is None:
            self._flush(out)
        return "" if self.fired is not None else "".join(out)

    def _event(self, event: str, out: list[str]) -> None:
        data = _data_of(event)
        if data is None:
            out.append(event + "\n\n")  # comments and non-data fields pass as they came
            return
        if data == "[DONE]":
            self._flush(out)
            if self.fired is None:
                self.done = True
                out.append(DONE)
            return
        try:
            chunk = _decode(data)
        except (msgspec.DecodeError, RecursionError):
            out.append(event + "\n\n")
            return
        if not isinstance(chunk, dict):
            out.append(event + "\n\n")
            return
        self._remember(chunk)
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and len(choices) == 1 else None
        delta = choice.get("delta") if isinstance(choice, dict) else None
        content = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(delta, dict) and self.attempts > 1 and "role" in delta:
            assert isinstance(choice, dict)
            del delta["role"]  # the client had the role from the first attempt: one stream
            if not content and not _meaningful(delta, choice):
                return
        if isinstance(delta, dict) and delta.get("tool_calls"):
            self._flush(out)  # held text goes first: the client sees the upstream's order
            if self.fired is not None:
                return
        if isinstance(content, str) and content and isinstance(delta, dict):
            assert isinstance(choice, dict)
            verdict = self.pipeline.feed(content)
            if verdict.observed and self.observed is None:
                self.observed = verdict
            if verdict.fired:
                self.fired = verdict
                return
            self._release(verdict.release, out)
            del delta["content"]
            if not _meaningful(delta, choice):
                return
        if (isinstance(choice, dict) and choice.get("finish_reason")) or chunk.get("usage"):
            self._flush(out)
            if self.fired is not None:
                return
        out.append(self._encode(chunk))

    def _remember(self, chunk: dict[str, Any]) -> None:
        ident = self.identity
        if ident.id is None:
            ident.id = chunk.get("id") if isinstance(chunk.get("id"), str) else None
            created = chunk.get("created")
            ident.created = created if isinstance(created, int) else None
        chunk["id"], chunk["model"] = ident.id, self.model
        if ident.created is not None:
            chunk["created"] = ident.created

    def _release(self, text: str, out: list[str]) -> None:
        if not text:
            return
        self.delivered.append(text)
        chunk = {
            "id": self.identity.id,
            "object": "chat.completion.chunk",
            "created": self.identity.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
        }
        out.append(self._encode(chunk))

    def _flush(self, out: list[str]) -> None:
        verdict = self.pipeline.finish()
        if verdict.fired:
            self.fired = verdict
            return
        self._release(verdict.release, out)

    @staticmethod
    def _encode(chunk: dict[str, Any]) -> str:
        text = _encode(chunk).decode()
        if "\u2028" in text or "\u2029" in text:  # line breaks to some SSE readers
            text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
        return "data: " + text + "\n\n"


def _data_of(event: str) -> str | None:
    lines = [line[5:].lstrip(" ") for line in event.split("\n") if line.startswith("data:")]
    return "\n".join(lines) if lines else None


def _meaningful(delta: dict[str, Any], choice: dict[str, Any]) -> bool:
    """Whether a chunk whose content was taken out still says something (role, tools, end)."""
    return any(v is not None for v in delta.values()) or bool(choice.get("finish_reason"))
