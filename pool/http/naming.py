"""The model name the client sees: the one it asked for, never a provider's name.

Upstreams (and the Node's adapters) answer with their own model name: the served name the
catalog gives them (``"model": "Qwen/Qwen2.5-7B-Instruct"``) or one of their own (a dated
snapshot). The client asked for a model group (``qwen-local``). The relay rewrites every JSON
member ``"model": "<anything>"`` to ``"model": "<asked>"`` in the body and in each stream
chunk: chat, Responses and Messages put it at the top level, in ``response`` or in
``message``, and the member reads the same wherever it sits. Text inside a JSON string never
matches (its quotes are escaped). A member cut between two chunks is held back until the
next chunk; nothing else is ever held (docs/http-api.md).
"""

from __future__ import annotations

import json
import re

MEMBER = re.compile(r'"model"\s*:\s*"(?:[^"\\]|\\.)*"')
# The end of a chunk that may be the start of a member: "m, "model", "model": "Qwen/Qw ...
PARTIAL = re.compile(r'"(?:m(?:o(?:d(?:e(?:l(?:"\s*(?::\s*(?:"(?:[^"\\]|\\.)*\\?)?)?)?)?)?)?)?)?\Z')
MAX_HELD = 1024  # a longer "value" is not a model name: pass it on rather than hold it


class ModelNames:
    """Rewrites the model member of relayed JSON to the name the client asked for."""

    __slots__ = ("_carry", "_member")

    def __init__(self, asked: str) -> None:
        self._member = '"model":' + json.dumps(asked)
        self._carry = ""

    def whole(self, text: str) -> str:
        """A complete body."""
        return MEMBER.sub(self._replace, text) if '"model"' in text else text

    def chunk(self, text: str) -> str:
        """The next piece of a stream; a trailing partial member waits for the next piece."""
        text = self.whole(self._carry + text)  # complete members first, then the tail
        held = PARTIAL.search(text, max(0, len(text) - MAX_HELD))
        cut = held.start() if held is not None else len(text)
        self._carry = text[cut:]
        return text[:cut]

    def flush(self) -> str:
        """What is still held at the end of the stream."""
        carry, self._carry = self._carry, ""
        return self.whole(carry)

    def _replace(self, _: re.Match[str]) -> str:
        return self._member
