"""A run's output seen through a translator: what the relay reads for a translated request.

It wraps the Node's ``RunChannel`` with the same ``get``/``get_nowait`` the relay uses, so the
relay (and anything placed on it for the client's protocol) sees the client's protocol and
the untranslated path is not touched. A translation failure becomes the run's failed end,
which the relay reports in the client's own error shape; what follows it is dropped.
"""

from __future__ import annotations

from nodes import wire
from nodes.runs import FilteredRun, RunChannel
from pool.translate.common import StreamTranslator, TranslationError, WholeTranslator

MAX_WHOLE_BODY_CHARS = 64 * 1024 * 1024  # as the relay bounds an untranslated answer


class TranslatedChannel(FilteredRun):
    """``channel``'s items translated by ``stream`` (a streamed run) or ``whole`` (not)."""

    __slots__ = ("_body", "_ended", "_size", "_stream", "_whole")

    def __init__(
        self,
        channel: RunChannel,
        *,
        stream: StreamTranslator | None = None,
        whole: WholeTranslator | None = None,
    ) -> None:
        super().__init__(channel)
        self._stream = stream
        self._whole = whole
        self._body: list[str] = []
        self._size = 0
        self._ended = False

    def _take(self, item: str | wire.RunEnd) -> None:
        """Translate one item; input that gave no output yet is held by the translator, not
        by a client, so it is released at once (R-IN-5: the Node keeps sending)."""
        self._translate(item)
        if not self._out:
            self._src.release()

    def _translate(self, item: str | wire.RunEnd) -> None:
        if self._ended:
            return
        try:
            if isinstance(item, str):
                self._text(item)
            else:
                self._end(item)
        except TranslationError as exc:
            usage = item.usage if isinstance(item, wire.RunEnd) else None
            self._fail(exc, usage)

    def _text(self, text: str) -> None:
        if self._stream is not None:
            out = self._stream.feed(text)
            if out:
                self._out.append(out)
            return
        self._size += len(text)
        if self._size > MAX_WHOLE_BODY_CHARS:
            raise TranslationError("the upstream's response is too large", code="upstream_error")
        self._body.append(text)

    def _end(self, end: wire.RunEnd) -> None:
        if end.ok:
            if self._stream is not None:
                tail = self._stream.close()
            else:
                assert self._whole is not None
                tail = self._whole("".join(self._body))
            if tail:
                self._out.append(tail)
        self._ended = True
        self._out.append(end)

    def _fail(self, exc: TranslationError, usage: wire.Usage | None) -> None:
        self._ended = True
        error = wire.RunError(code=exc.code, message=exc.message)
        self._out.append(wire.RunEnd(run_id=self._src.run_id, ok=False, error=error, usage=usage))
