"""Cache affinity inside exact capacity (R-AFF-1): which provider last ran a conversation.

A key (an opaque digest made by the HTTP surface, never a client's raw text) maps to the
provider that last served it and until when the entry holds (``ttl_s`` after that run began).
The map is bounded: at most ``MAX_KEYS`` entries, the least recently used dropped first, so a
flood of distinct keys never grows memory past it. Selection asks ``preferred``: the remembered
provider wins only when it is among the request's candidates and has a free slot (the pool's
own rule decides otherwise), so capacity and the queue's order are never changed by it.
"""

from __future__ import annotations

from collections import OrderedDict

MAX_KEYS = 65536


class AffinityMap:
    """key -> (provider id, valid until) on the engine's clock; LRU-bounded."""

    __slots__ = ("_entries", "hits", "max_keys", "misses")

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.max_keys = max_keys
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.hits: dict[str, int] = {}  # model group -> requests the remembered provider took
        self.misses: dict[str, int] = {}  # model group -> keyed requests it did not take

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: str, now: float) -> str | None:
        """The provider ``key`` last ran on, while its entry holds."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[1] <= now:
            del self._entries[key]
            return None
        return entry[0]

    def remember(self, key: str, provider_id: str, until: float) -> None:
        self._entries[key] = (provider_id, until)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_keys:
            self._entries.popitem(last=False)

    def counted(self, model: str, hit: bool) -> None:
        counts = self.hits if hit else self.misses
        counts[model] = counts.get(model, 0) + 1

    def forget_provider(self, provider_id: str) -> None:
        """An apply removed the provider: its entries stop winning (they would not anyway)."""
        for key in [k for k, (pid, _) in self._entries.items() if pid == provider_id]:
            del self._entries[key]
