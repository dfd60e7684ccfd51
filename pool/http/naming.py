"""The model name the client sees: the one it asked for, never the provider's served name.

Upstreams (and the Node's adapters) answer with the served model name (``"model":
"Qwen/Qwen2.5-7B-Instruct"``); the client asked for a model group (``qwen-local``). The relay
rewrites the JSON member ``"model": <served>`` to ``"model": <asked>`` in every body and
stream chunk (chat, Responses and Messages put it at the top level, in ``response`` or in
``message``: the member is the same text wherever it sits). A member split across two chunks
is held back until the next chunk; nothing else is ever held (docs/http-api.md).
"""

from __future__ import annotations

import json


class ModelNames:
    """Rewrites the served model name to the asked one in relayed text."""

    __slots__ = ("_carry", "_longest", "_pairs")

    def __init__(self, asked: str, served: str) -> None:
        self._pairs: tuple[tuple[str, str], ...] = ()
        if asked != served:
            old, new = json.dumps(served), json.dumps(asked)
            self._pairs = tuple((f'"model":{sep}{old}', f'"model":{sep}{new}') for sep in ("", " "))
        self._longest = max((len(old) for old, _ in self._pairs), default=0)
        self._carry = ""

    def whole(self, text: str) -> str:
        """A complete body."""
        for old, new in self._pairs:
            text = text.replace(old, new)
        return text

    def chunk(self, text: str) -> str:
        """The next piece of a stream; a trailing partial member waits for the next piece."""
        if not self._pairs:
            return text
        text = self.whole(self._carry + text)
        keep = self._partial_tail(text)
        self._carry = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep] if keep else text

    def flush(self) -> str:
        """What is still held at the end of the stream."""
        carry, self._carry = self._carry, ""
        return carry

    def _partial_tail(self, text: str) -> int:
        """Length of the longest end of ``text`` that is a proper start of a member."""
        lo = max(0, len(text) - self._longest + 1)
        start = text.find('"', lo)
        while start != -1:
            tail = text[start:]
            if any(old.startswith(tail) for old, _ in self._pairs):
                return len(tail)
            start = text.find('"', start + 1)
        return 0
