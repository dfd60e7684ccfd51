"""Reasoning across the APIs (R-XLATE-4): a client's thinking or reasoning settings as the
provider's own switch, and whether the client asked to see the provider's reasoning text.

A profile declares its switch in ``extensions.thinking`` (docs/configuration.md):
``reasoning_effort`` (OpenAI's Chat field; the default of an ``openai_chat`` profile),
``glm`` (Z.AI's ``thinking: {type: enabled|disabled}``; the built-in GLM profiles),
``enable_thinking`` (vLLM/Qwen's ``chat_template_kwargs.enable_thinking``), or ``none``
(nothing is sent; the settings are named in ``x-iop-dropped``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from catalog.config.profiles.model import THINKING_STYLES
from pool.translate.common import invalid, unsupported
from pool.translate.fields import Dropped

STYLES = THINKING_STYLES
# A client's effort as Chat's ``reasoning_effort`` (the levels every provider that takes the
# field knows); ``none`` is the Responses API's "do not reason".
EFFORTS = {
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}
# Messages ``thinking.budget_tokens`` -> effort: below 4096 low, below 16384 medium, else high.
BUDGET_LOW, BUDGET_MEDIUM = 4096, 16384
SUMMARIES = ("auto", "concise", "detailed")


@dataclass(slots=True)
class Switch:
    """What the client asked: reasoning on or off (None: not said) and at which effort."""

    on: bool | None = None
    effort: str | None = None
    where: str = "thinking"  # the client's field, for x-iop-dropped
    effort_where: str = "output_config.effort"

    def apply(self, chat: dict[str, Any], style: str, dropped: Dropped) -> None:
        """Set the provider's own switch in ``chat``; name what it cannot carry."""
        if self.on is None and self.effort is None:
            return
        if style == "reasoning_effort":
            if self.effort is not None and self.on is not False:
                chat["reasoning_effort"] = self.effort
            elif self.on is not None:
                dropped.add(self.where)  # on or off without a level: Chat has no switch
            return
        if style == "none":
            dropped.add(self.where if self.on is not None else self.effort_where)
            return
        on = self.on if self.on is not None else True
        if style == "glm":
            chat["thinking"] = {"type": "enabled" if on else "disabled"}
        else:
            chat["chat_template_kwargs"] = {"enable_thinking": on}
        if self.effort is not None:
            dropped.add(self.effort_where)  # the switch has no level


def _effort(value: Any, where: str) -> str:
    if not isinstance(value, str) or value not in EFFORTS:
        raise unsupported(where, f"'{value}' is not an effort ({', '.join(EFFORTS)})")
    return EFFORTS[value]


def messages_switch(data: dict[str, Any]) -> tuple[Switch, bool]:
    """Messages ``thinking`` and ``output_config.effort``: (the switch, whether the client
    wants thinking blocks back)."""
    switch = Switch()
    shown = False
    thinking = data.get("thinking")
    if thinking is not None:
        if not isinstance(thinking, dict):
            raise invalid("thinking", "must be an object")
        kind = thinking.get("type")
        if kind == "enabled":
            budget = thinking.get("budget_tokens")
            if not isinstance(budget, int) or isinstance(budget, bool):
                raise invalid("thinking.budget_tokens", "must be an integer")
            switch.on = True
            switch.effort = (
                "low" if budget < BUDGET_LOW else "medium" if budget < BUDGET_MEDIUM else "high"
            )
        elif kind == "adaptive":
            switch.on = True
        elif kind == "disabled":
            switch.on = False
        else:
            raise unsupported("thinking.type", f"'{kind}' is not enabled, adaptive or disabled")
        shown = switch.on is True and thinking.get("display") != "omitted"
    config = data.get("output_config")
    if isinstance(config, dict) and config.get("effort") is not None:
        switch.effort = _effort(config["effort"], "output_config.effort")
    return switch, shown


def responses_switch(data: dict[str, Any]) -> tuple[Switch, bool]:
    """Responses ``reasoning``: (the switch, whether the client wants a reasoning summary)."""
    switch = Switch(where="reasoning", effort_where="reasoning.effort")
    reasoning = data.get("reasoning")
    if reasoning is None:
        return switch, False
    if not isinstance(reasoning, dict):
        raise invalid("reasoning", "must be an object")
    effort = reasoning.get("effort")
    if effort == "none":
        switch.on = False
    elif effort is not None:
        switch.effort = _effort(effort, "reasoning.effort")
    summary = reasoning.get("summary", reasoning.get("generate_summary"))
    return switch, summary in SUMMARIES and switch.on is not False
