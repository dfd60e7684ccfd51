"""One translated request: the body for the provider and the translators of its answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from catalog.config.profiles.model import default_thinking
from pool.translate import chat_via_messages as cvm
from pool.translate import messages_via_chat as mvc
from pool.translate import responses_via_chat as rvc
from pool.translate.chat_via_messages_stream import ChatViaMessagesStream
from pool.translate.common import StreamTranslator, WholeTranslator, dumps
from pool.translate.fields import Dropped, Options
from pool.translate.messages_via_chat_stream import MessagesViaChatStream
from pool.translate.responses_via_chat_stream import ResponsesViaChatStream


@dataclass(slots=True)
class Translation:
    """``body`` runs as ``operation`` on the provider; ``answer`` is set when the Edge answers
    itself (``count_tokens`` by estimate) and nothing runs. ``dropped`` names what the
    translation left out (R-XLATE-5: ``x-iop-dropped``)."""

    operation: str
    body: bytes = b""
    whole: WholeTranslator | None = None
    stream: StreamTranslator | None = None
    answer: str | None = None
    dropped: tuple[str, ...] = ()


def translation(
    kind: str,
    data: dict[str, Any],
    model: str,
    *,
    stream: bool,
    input_estimate: int,
    driver: str = "openai_chat",
    thinking: str | None = None,
    refuse_dropped: bool = False,
) -> Translation:
    """Translate a request of route ``kind`` (``pool.translate.plan.route``) for ``model``
    on a provider of ``driver`` whose thinking switch is ``thinking`` (its driver's default
    when None); with ``refuse_dropped`` what would be dropped is refused.

    Raises ``TranslationError`` for what cannot be translated (R-XLATE-2, R-XLATE-5).
    """
    options = Options(
        images=mvc.images_for(driver),
        thinking=thinking or default_thinking(driver),
        structured=driver != "cli",
        dropped=Dropped(refuse_dropped),
    )
    if kind == "messages_via_chat":
        body, shown = mvc.chat_request(data, model, options)
        return Translation(
            "chat_completions",
            dumps(body).encode(),
            whole=lambda text: mvc.messages_response(text, shown),
            stream=MessagesViaChatStream(model, shown) if stream else None,
            dropped=tuple(options.dropped.names),
        )
    if kind == "chat_via_messages":
        body = cvm.messages_request(data, model)
        asked = data.get("stream_options")
        include_usage = isinstance(asked, dict) and bool(asked.get("include_usage"))
        return Translation(
            "messages",
            dumps(body).encode(),
            whole=cvm.chat_response,
            stream=ChatViaMessagesStream(model, include_usage) if stream else None,
        )
    if kind == "responses_via_chat":
        body, answering = rvc.chat_request(data, model, options)
        return Translation(
            "chat_completions",
            dumps(body).encode(),
            whole=lambda text: rvc.responses_response(text, answering),
            stream=ResponsesViaChatStream(model, answering) if stream else None,
            dropped=tuple(options.dropped.names),
        )
    if kind == "count_tokens_estimate":
        mvc.chat_request(data, model, options)  # refuses what the estimate could not count
        return Translation(
            "count_tokens",
            answer=mvc.count_tokens_estimate(input_estimate),
            dropped=tuple(options.dropped.names),
        )
    raise ValueError(f"unknown translation {kind!r}")
