"""The one small interface every adapter implements, and what it passes around."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from nodes.tokens import token_figure
from nodes.wire import RunError, Usage

Emit = Callable[[str], Awaitable[None]] | Callable[[str], None]


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One run as an adapter sees it: the body is the upstream (or normalized) request."""

    run_id: str
    operation: str
    stream: bool
    body: bytes
    forward_headers: Mapping[str, str] = field(default_factory=dict)
    credential: str | None = field(default=None, repr=False)  # managed: this run's slot secret


class AdapterError(Exception):
    """A run failed; ``code`` is a stable wire code.

    ``message`` is generic and goes to the Edge; ``detail`` (upstream host:port, the
    upstream's own error text, a CLI program's stderr) goes only to this Node's log line
    for the run (docs/http-api.md, "Upstream error messages").
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        detail: str = "",
        retryable: bool = False,
        status: int | None = None,
        phase: str = "",
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail
        self.retryable = retryable
        self.status = status
        self.phase = phase  # one of nodes.wire.PHASE_*; "" = unknown (R-HEALTH-1)
        self.retry_after_s = retry_after_s

    @property
    def log_text(self) -> str:
        """What the Node's log says about this failure: the detail when there is one."""
        return self.detail or self.message

    def to_wire(self) -> RunError:
        return RunError(
            code=self.code,
            message=self.message,
            retryable=self.retryable,
            status=self.status,
            phase=self.phase,
            retry_after_s=self.retry_after_s,
        )


class Adapter(Protocol):
    """Run one request, emitting output text in order; return usage if known."""

    async def run(self, request: RunSpec, emit: Emit) -> Usage | None: ...

    async def aclose(self) -> None: ...


async def send(emit: Emit, text: str) -> None:
    """Call ``emit`` whether it is a plain function or a coroutine function."""
    result = emit(text)
    if inspect.isawaitable(result):
        await result


def parse_json_body(body: bytes) -> dict[str, Any]:
    """Decode a request body that must be a JSON object, or fail as bad_request."""
    try:
        data = msgspec.json.decode(body) if body else {}
    except msgspec.DecodeError:
        raise AdapterError("bad_request", "request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise AdapterError("bad_request", "request body must be a JSON object")
    return data


def usage_from(obj: Any) -> Usage | None:
    """Usage from an OpenAI (prompt/completion) or Anthropic/Responses (input/output) dict.

    ``input_tokens`` is every prompt token and ``cached_input_tokens`` the part read from the
    upstream's prompt cache (R-COST-1): OpenAI Chat's ``prompt_tokens_details.cached_tokens``
    and Responses' ``input_tokens_details.cached_tokens`` are already inside the prompt
    figure; Anthropic's ``cache_read_input_tokens`` and ``cache_creation_input_tokens`` are
    apart from its ``input_tokens``, so they are added to it (the read ones are the cached
    ones). An upstream that reports none has 0 cached tokens."""
    if not isinstance(obj, dict):
        return None
    inp = obj.get("prompt_tokens", obj.get("input_tokens"))
    out = obj.get("completion_tokens", obj.get("output_tokens"))
    if inp is None and out is None:
        return None
    # R-IN-6: a negative, huge or non-numeric figure counts 0 with a log line.
    inp_n = token_figure(inp, "upstream input_tokens")
    details = obj.get("prompt_tokens_details", obj.get("input_tokens_details"))
    cached = 0
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        cached = min(token_figure(details.get("cached_tokens"), "upstream cached_tokens"), inp_n)
    read = obj.get("cache_read_input_tokens")
    written = obj.get("cache_creation_input_tokens")
    if read is not None or written is not None:  # Anthropic: apart from input_tokens
        cached = token_figure(read, "upstream cache_read_input_tokens")
        inp_n += cached + token_figure(written, "upstream cache_creation_input_tokens")
    return Usage(
        input_tokens=inp_n,
        output_tokens=token_figure(out, "upstream output_tokens"),
        cached_input_tokens=cached,
    )
