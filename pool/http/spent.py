"""What a request spent, metered once however it ended (R-BUD-2).

Two facts the relay cannot learn from the transport alone:

- whether a streamed answer is *complete* for its client: once the terminal event of the
  client's API (``data: [DONE]``, ``event: message_stop``, ``event: response.completed``)
  went out, the answer is whole whatever the client does next, and the Edge still reads the
  run to its end for the upstream's usage (docs/metering.md, "Complete streams");
- how much text a run carried when the upstream's usage never comes (a run cut after the
  first byte, an attempt the Stream Evidence Gate discarded): counted from the text fields of
  the events (not their bytes, which are mostly SSE and JSON framing), ~4 characters a token.
  A stream's first ``SAMPLE_PIECES`` pieces are read for their text; the rest are counted by
  their bytes at the text-to-bytes ratio of that sample (one stream's events are framed
  alike), so a long stream pays one addition per piece, not a scan.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from pool.metering import RequestRecord

# Terminal events, matched at the start of an SSE line: a JSON string cannot hold a raw
# newline, so model text that quotes one of them never matches.
_TERMINAL_MARKS = (
    b"data: [DONE]",
    b"event: message_stop",
    b"event: response.completed",
    b"event: response.incomplete",
)
# The text-bearing string fields of Chat, Messages and Responses events and bodies.
_TEXT_FIELD = re.compile(
    r'"(?:content|text|delta|arguments|partial_json|thinking|refusal|reasoning_content)"'
    r'\s*:\s*"((?:[^"\\]|\\.)*)"'
)
CHARS_PER_TOKEN = 4  # the documented estimate (docs/metering.md)
SAMPLE_PIECES = 16  # pieces of a stream read for their text before the ratio takes over
# After the terminal event a gone client's run is read on for its usage at most this long.
TERMINAL_GRACE_S = 10.0


def ends_stream(body: bytes) -> bool:
    """True when ``body`` holds the terminal event of a stream (at the start of a line)."""
    for mark in _TERMINAL_MARKS:
        at = body.find(mark)
        while at >= 0:
            if at == 0 or body[at - 1] == 0x0A:
                return True
            at = body.find(mark, at + 1)
    return False


def text_chars(payload: str) -> int:
    """Characters of model text in an SSE piece or a JSON body (escapes count as written)."""
    return sum(len(found) for found in _TEXT_FIELD.findall(payload))


def tokens_of(chars: int) -> int:
    """The estimate for ``chars`` characters of text."""
    return (chars + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


class TextTally:
    """Model text a stream carried, for an estimate (see the module docstring)."""

    __slots__ = ("_rest", "_sample_bytes", "_sample_chars", "_sampled")

    def __init__(self) -> None:
        self._sampled = 0
        self._sample_bytes = 0
        self._sample_chars = 0
        self._rest = 0  # characters of the pieces after the sample

    def add(self, piece: str) -> None:
        if self._sampled < SAMPLE_PIECES:
            self._sampled += 1
            self._sample_bytes += len(piece)
            self._sample_chars += text_chars(piece)
        else:
            self._rest += len(piece)

    @property
    def chars(self) -> int:
        if not self._rest or not self._sample_bytes:
            return self._sample_chars
        return self._sample_chars + self._rest * self._sample_chars // self._sample_bytes


@dataclass(frozen=True, slots=True)
class Spent:
    """Tokens an attempt used that the request's own usage does not include (a discarded
    attempt): metered as a tokens-only ledger row on its provider, marked estimated."""

    provider_id: str
    input_tokens: int
    output_tokens: int
    estimated: bool = True

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens

    def record_of(self, request: RequestRecord) -> RequestRecord:
        """The tokens-only record of this attempt, beside the request's own ``request``."""
        return dataclasses.replace(
            request,
            provider_id=self.provider_id,
            status=200,
            code=None,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cached_input_tokens=0,
            estimated=self.estimated,
            duration_s=0.0,
            tokens_only=True,
        )
