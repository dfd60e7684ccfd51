"""``repeat_guard``: hold back a look-behind window and fire on a back-to-back repeat (R-SEG-5).

The exact rule is written in docs/stream-evidence-gate.md. In short, with ``H`` =
``hold_evidence_runes`` (Unicode code points): the window fires when it ends in ``k >= 2``
back-to-back copies of one unit of ``L`` runes, ``1 <= L <= H // 4``, whose copies cover at
least ``ceil(H / 2)`` runes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Repeat:
    """Evidence of a repeat: the unit and how many back-to-back copies end the window."""

    unit: str
    copies: int


def find_repeat(window: str, hold: int) -> Repeat | None:
    """The shortest unit whose back-to-back copies end ``window`` and cover half of ``hold``.

    A suffix that is periodic with period ``L`` equals its own last ``L`` runes repeated, so a
    loop that ends mid-unit is found through the unit's rotation. Candidate periods are the
    earlier places where the window's last few runes occur (found by ``str.rfind``), so
    ordinary text costs a search or two, not one comparison per possible unit length.
    """
    need = -(-hold // 2)  # ceil(H / 2): the runes the copies must cover
    size_max = hold // 4
    length = len(window)
    if length < need or size_max < 1:
        return None
    probe = max(1, min(4, need - size_max))  # copies always cover L + probe runes
    tail = window[-probe:]
    low = max(0, length - probe - size_max)
    end = length - 1
    while True:
        at = window.rfind(tail, low, end)
        if at < 0:
            return None
        size = length - probe - at
        copies = max(2, -(-need // size))
        span = size * copies
        # A span longer than the window rules this unit out, not a longer one: spans are not
        # monotonic in the unit length (H = 54: 8 runes x 4 = 32, 9 runes x 3 = 27).
        if span <= length:
            unit = window[-size:]
            if window[-span:] == unit * copies:
                return Repeat(unit, copies)
        end = at + probe - 1


class RepeatGuard:
    """One request's ``repeat_guard`` (R-SEG-3: not time-based, not kept across requests).

    ``feed`` returns the text that has left the look-behind window and may be released.
    In ``observe`` mode (R-SEG-8) text is released at once and only the detection is kept.
    """

    __slots__ = ("_held", "evidence", "hold", "observe")

    def __init__(self, hold: int, observe: bool = False) -> None:
        self.hold = hold
        self.observe = observe
        self._held = ""
        self.evidence: Repeat | None = None

    @property
    def fired(self) -> bool:
        return self.evidence is not None

    def feed(self, text: str) -> str:
        """Add output text; return what may be released now ("" once fired in enforce mode).

        A long piece is checked every ``H // 4`` runes, so a loop inside one large chunk is
        caught as surely as one spread over many small ones.
        """
        step = max(1, self.hold // 4)
        if len(text) <= step:
            return self._feed(text)
        return "".join(self._feed(text[i : i + step]) for i in range(0, len(text), step))

    def _feed(self, text: str) -> str:
        if self.evidence is not None and not self.observe:
            return ""
        window = self._held + text
        if self.evidence is None:
            self.evidence = find_repeat(window, self.hold)
        if self.observe:
            self._held = window[-self.hold :]
            return text
        if self.evidence is not None:
            self._held = ""  # held text is discarded (R-SEG-6)
            return ""
        cut = len(window) - self.hold
        if cut <= 0:
            self._held = window
            return ""
        self._held = window[cut:]
        return window[:cut]

    def finish(self) -> str:
        """The stream ended normally: release whatever is still held."""
        if self.observe or self.evidence is not None:
            return ""
        held, self._held = self._held, ""
        return held
