"""The per-field tables of translation (R-XLATE-4, R-XLATE-5): one row per field of each
direction, saying whether it is mapped (to what), dropped (named in ``x-iop-dropped``) or
refused (why the answer would change meaning). ``docs/http-api.md``'s tables are these rows
(``tests/test_translate_fields.py`` compares them), and the translators read the top-level
rows to decide; a top-level field no row names is dropped, visibly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from pool.translate.common import unsupported

Action = Literal["map", "drop", "refuse"]
MAX_DROPPED = 32  # names in one x-iop-dropped header; the rest are counted as "other"
_SAFE_NAME = re.compile(r"[A-Za-z0-9_.\[\]-]{1,64}")
OTHER = "other"  # the metric label of a dropped name no row documents


@dataclass(frozen=True, slots=True)
class Row:
    """One field of a client's request (or of an answer): what translation does with it."""

    name: str  # as documented: ``thinking``, ``tools[].defer_loading``
    action: Action
    becomes: str  # what it becomes upstream, or why it is dropped or refused


def _table(*rows: Row) -> Mapping[str, Row]:
    return MappingProxyType({row.name: row for row in rows})


MESSAGES_TO_CHAT = _table(
    Row("model", "map", "the served model (R-CFG-2)"),
    Row("messages", "map", "`messages` (rows below)"),
    Row("system", "map", "first message, role `system` (string or text blocks)"),
    Row("max_tokens", "map", "`max_tokens`"),
    Row("temperature", "map", "`temperature`"),
    Row("top_p", "map", "`top_p`"),
    Row("stream", "map", "`stream`, with `stream_options.include_usage` (usage is metered)"),
    Row("stop_sequences", "map", "`stop` (at most 4; more are refused)"),
    Row("tools", "map", "`tools[]` of type `function` (`input_schema` -> `parameters`)"),
    Row("tool_choice", "map", "`auto` / `required` / `none` / the named function"),
    Row("metadata", "map", "`metadata.user_id` -> `user`; its other keys are dropped"),
    Row("thinking", "map", "the provider's thinking switch (Reasoning, below)"),
    Row("output_config", "map", "`effort` -> the provider's thinking switch; other keys dropped"),
    Row("context_management", "drop", "context editing is the Messages API's own"),
    Row("cache_control", "drop", "a caching hint, on any block, tool or the request"),
    Row("tools[].defer_loading", "drop", "every tool is sent"),
    Row("tools[] server tools", "drop", "left out of the request: the provider cannot run them"),
    Row("top_k", "drop", "Chat Completions has no `top_k`"),
    Row("service_tier", "drop", "a scheduling hint of the Messages API"),
    Row("messages[] thinking blocks", "drop", "earlier turns' thinking is not sent back"),
    Row("container", "refuse", "a code-execution container the provider does not have"),
    Row("mcp_servers", "refuse", "the provider cannot call MCP servers"),
)

RESPONSES_TO_CHAT = _table(
    Row("model", "map", "the served model (R-CFG-2)"),
    Row("input", "map", "`messages` (rows below)"),
    Row("instructions", "map", "first message, role `system`"),
    Row("max_output_tokens", "map", "`max_tokens`"),
    Row("temperature", "map", "`temperature`"),
    Row("top_p", "map", "`top_p`"),
    Row("parallel_tool_calls", "map", "`parallel_tool_calls`"),
    Row("stream", "map", "`stream`, with `stream_options.include_usage` (usage is metered)"),
    Row("tools", "map", "`tools[]` of type `function`; `namespace` tools as `NS__name`"),
    Row("tool_choice", "map", "same meaning; naming a tool that is left out is refused"),
    Row("text", "map", "`format` -> `response_format`; `verbosity` dropped"),
    Row("reasoning", "map", "`effort` -> the provider's thinking switch; `summary` (Reasoning)"),
    Row("prompt_cache_key", "map", "`prompt_cache_key`"),
    Row("safety_identifier", "map", "`safety_identifier`"),
    Row("user", "map", "`user`"),
    Row("store", "map", "`false`: echoed; `true` is refused (nothing is stored)"),
    Row("include", "drop", "served without the items the provider cannot make"),
    Row("metadata", "drop", "echoed in the Response, not sent"),
    Row("client_metadata", "drop", "the client's own bookkeeping"),
    Row("tools[] built-in tools", "drop", "left out of the request: the provider cannot run them"),
    Row("text.verbosity", "drop", "a length hint Chat Completions has no field for"),
    Row("truncation", "drop", "the provider truncates as it does"),
    Row("service_tier", "drop", "a scheduling hint of the Responses API"),
    Row("max_tool_calls", "drop", "a limit the provider has no field for"),
    Row("top_logprobs", "drop", "logprobs are not carried back"),
    Row("stream_options", "drop", "obfuscation is the Responses API's own"),
    Row("input[] reasoning items", "drop", "earlier turns' reasoning is not sent back"),
    Row("previous_response_id", "refuse", "nothing is stored: send the whole conversation"),
    Row("conversation", "refuse", "nothing is stored: send the whole conversation"),
    Row("background", "refuse", "background responses are stored responses"),
    Row("prompt", "refuse", "a stored prompt the provider does not have"),
)

# What comes back: the provider's answer as the client's.
ANSWER_FROM_CHAT = _table(
    Row("content", "map", "a `text` block / a `message` item with one `output_text` part"),
    Row("tool_calls", "map", "`tool_use` blocks / `function_call` items (`NS__name` split)"),
    Row(
        "reasoning_content",
        "map",
        "`thinking` blocks / a `reasoning` item with a summary, when the client asked "
        "(`thinking` not disabled and not `display: omitted`; `reasoning.summary`); else left out",
    ),
    Row("finish_reason", "map", "`stop_reason` / the Response's `status`"),
    Row("usage", "map", "input and output tokens; cached and reasoning tokens where reported"),
)

TABLES: Mapping[str, Mapping[str, Row]] = MappingProxyType(
    {
        "Anthropic Messages -> Chat Completions": MESSAGES_TO_CHAT,
        "Responses -> Chat Completions": RESPONSES_TO_CHAT,
        "Chat Completions answer -> Messages / Responses": ANSWER_FROM_CHAT,
    }
)
_DOCUMENTED = frozenset(row.name for table in TABLES.values() for row in table.values())


def render(table: Mapping[str, Row]) -> str:
    """A table as the Markdown of docs/http-api.md."""
    lines = ["| field | done | becomes |", "| --- | --- | --- |"]
    done = {"map": "mapped", "drop": "dropped", "refuse": "refused"}
    lines += [f"| `{r.name}` | {done[r.action]} | {r.becomes} |" for r in table.values()]
    return "\n".join(lines)


def metric_label(name: str) -> str:
    """The ``field`` label of ``iop_translation_dropped_total``: a documented row, else
    ``other`` (a client's own field names never become label values)."""
    return name if name in _DOCUMENTED else OTHER


class Dropped:
    """What one translation leaves out (R-XLATE-5): named in ``x-iop-dropped`` and counted;
    with ``refuse`` (``translate: {unsupported: refuse}``) refused instead."""

    __slots__ = ("names", "refuse")

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.names: list[str] = []

    def add(self, name: str) -> None:
        shown = name if _SAFE_NAME.fullmatch(name) or name in _DOCUMENTED else "(unnamed)"
        if self.refuse:
            raise unsupported(
                shown,
                "is not carried over by translation, and this model group refuses what it "
                "would drop (translate.unsupported: refuse)",
            )
        if shown not in self.names and len(self.names) < MAX_DROPPED:
            self.names.append(shown)

    def top_level(self, data: Mapping[str, Any], table: Mapping[str, Row]) -> None:
        """Each top-level field by its row: refused, dropped, or left to the translator."""
        for name in data:
            row = table.get(name)
            if row is None:
                self.add(name)
            elif row.action == "refuse":
                raise unsupported(name, f"is refused: {row.becomes}")
            elif row.action == "drop" and data[name] not in (None, [], {}):
                self.add(name)

    def extend(self, names: Iterable[str]) -> None:
        for name in names:
            self.add(name)


@dataclass(slots=True)
class Options:
    """How one request is translated for its provider: which images it takes (``all``,
    ``inline``: base64 only, ``none``), its thinking switch (``pool.translate.reasoning``),
    whether it has structured output, and what is dropped."""

    images: str = "all"
    thinking: str = "reasoning_effort"
    structured: bool = True
    dropped: Dropped = field(default_factory=Dropped)
