"""One translated request: the body for the provider and the translators of its answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pool.translate import chat_via_messages as cvm
from pool.translate import messages_via_chat as mvc
from pool.translate import responses_via_chat as rvc
from pool.translate.chat_via_messages_stream import ChatViaMessagesStream
from pool.translate.common import StreamTranslator, WholeTranslator, dumps
from pool.translate.messages_via_chat_stream import MessagesViaChatStream
from pool.translate.responses_via_chat_stream import ResponsesViaChatStream


@dataclass(slots=True)
class Translation:
    """``body`` runs as ``operation`` on the provider; ``answer`` is set when the Edge answers
    itself (``count_tokens`` by estimate) and nothing runs."""

    operation: str
    body: bytes = b""
    whole: WholeTranslator | None = None
    stream: StreamTranslator | None = None
    answer: str | None = None


def translation(
    kind: str,
    data: dict[str, Any],
    model: str,
    *,
    stream: bool,
    input_estimate: int,
    driver: str = "openai_chat",
) -> Translation:
    """Translate a request of route ``kind`` (``pool.translate.plan.route``) for ``model``
    on a provider of ``driver``.

    Raises ``TranslationError`` for what cannot be translated (R-XLATE-2).
    """
    if kind == "messages_via_chat":
        body = mvc.chat_request(data, model, mvc.images_for(driver))
        return Translation(
            "chat_completions",
            dumps(body).encode(),
            whole=mvc.messages_response,
            stream=MessagesViaChatStream(model) if stream else None,
        )
    if kind == "chat_via_messages":
        body = cvm.messages_request(data, model)
        options = data.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        return Translation(
            "messages",
            dumps(body).encode(),
            whole=cvm.chat_response,
            stream=ChatViaMessagesStream(model, include_usage) if stream else None,
        )
    if kind == "responses_via_chat":
        body = rvc.chat_request(data, model, mvc.images_for(driver))
        echo = rvc.echo_fields(data)
        return Translation(
            "chat_completions",
            dumps(body).encode(),
            whole=lambda text: rvc.responses_response(text, echo),
            stream=ResponsesViaChatStream(model, echo) if stream else None,
        )
    if kind == "count_tokens_estimate":
        mvc.chat_request(data, model)  # refuses what the estimate could not count faithfully
        return Translation("count_tokens", answer=mvc.count_tokens_estimate(input_estimate))
    raise ValueError(f"unknown translation {kind!r}")
