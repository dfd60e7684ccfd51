"""The in-memory, bounded map of usage not yet written to the ledger (pure, no I/O)."""

from __future__ import annotations

from typing import NamedTuple

from pool.metering.labels import NO_LABEL

HOUR_S = 3600


class UsageKey(NamedTuple):
    """One ledger row's key: the hour (epoch seconds) and the attribution labels."""

    bucket: int
    principal_ref: str
    token_ref: str
    model_group: str
    attributed_to: str
    attribution: str
    estimated: bool
    requested_group: str = NO_LABEL  # R-FALL-1: the group asked of, when a fallback served

    def collapsed(self) -> UsageKey:
        """The overflow key of this hour: every label but ``estimated`` set to ``-``."""
        dash = NO_LABEL
        return UsageKey(self.bucket, dash, dash, dash, dash, dash, self.estimated, dash)


class Counts:
    """Running sums for one key; ``cost_pico`` in 10^-12 of the currency (R-COST-2)."""

    __slots__ = (
        "cached_input_tokens", "cost_pico", "errors", "input_tokens", "output_tokens", "requests",
    )  # fmt: skip

    def __init__(
        self,
        requests: int = 0,
        errors: int = 0,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cached_input_tokens: int = 0,
        cost_pico: int = 0,
    ) -> None:
        self.requests = requests
        self.errors = errors
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.cached_input_tokens = cached_input_tokens
        self.cost_pico = cost_pico

    def add(self, other: Counts) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cached_input_tokens += other.cached_input_tokens
        self.cost_pico += other.cost_pico

    def as_tuple(self) -> tuple[int, int, int, int, int, int]:
        return (self.requests, self.errors, self.input_tokens, self.output_tokens,
                self.cached_input_tokens, self.cost_pico)  # fmt: skip

    def __repr__(self) -> str:
        return f"Counts{self.as_tuple()}"


def hour_bucket(epoch_s: float) -> int:
    """The start of the UTC hour that contains ``epoch_s``."""
    return int(epoch_s) // HOUR_S * HOUR_S


class PendingUsage:
    """At most ``max_keys`` keys plus a few overflow keys; ``full`` asks for an early flush.

    Once full, usage for a new key is folded into its hour's collapsed key, so totals are
    kept and memory stays bounded while a flush is under way.
    """

    __slots__ = ("_items", "max_keys")

    def __init__(self, max_keys: int) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.max_keys = max_keys
        self._items: dict[UsageKey, Counts] = {}

    def __len__(self) -> int:
        return len(self._items)

    @property
    def full(self) -> bool:
        return len(self._items) >= self.max_keys

    def add(self, key: UsageKey, counts: Counts) -> bool:
        """Add ``counts`` under ``key``; True when they were folded into the collapsed key."""
        entry = self._items.get(key)
        folded = False
        if entry is None:
            if self.full:
                folded = True
                key = key.collapsed()
                entry = self._items.get(key)
            if entry is None:
                entry = self._items[key] = Counts()
        entry.add(counts)
        return folded

    def items(self) -> list[tuple[UsageKey, Counts]]:
        """A copy of what is pending (the budget view recounts it, R-BUD-1)."""
        return list(self._items.items())

    def take(self) -> dict[UsageKey, Counts]:
        """Hand over everything pending and start empty."""
        items, self._items = self._items, {}
        return items

    def merge(self, items: dict[UsageKey, Counts]) -> None:
        """Put back a batch that could not be written (same bound applies)."""
        for key, counts in items.items():
            self.add(key, counts)
