"""What one request is counted as: the record, its bounded labels and its usage attribution.

Every label value is checked against the active snapshot, so label sets are bounded by the
config and a value that is not a configured id or ref (a raw token passed by mistake, a
caller-supplied model name) becomes ``-`` (R-REF-6, R-AUTH-6).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from nodes.tokens import token_figure

if TYPE_CHECKING:
    from catalog.config import EdgeSnapshot

NO_LABEL = "-"  # an unknown or empty label value
_WORD = re.compile(r"[a-z][a-z0-9_]{0,47}")  # operation names and error codes
OTHER = "other"


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished request, as the HTTP surface reports it to the meter."""

    operation: str
    model_group: str
    provider_id: str | None
    principal_ref: str | None
    token_ref: str | None
    status: int
    code: str | None
    input_tokens: int
    output_tokens: int
    estimated: bool
    duration_s: float
    stream: bool
    tokens_only: bool = False  # an attempt discarded inside a request: tokens, no request
    cached_input_tokens: int = 0  # R-COST-1: of input_tokens, read from the prompt cache
    requested_group: str = ""  # R-FALL-1: the group asked of, when a fallback group served it
    # R-OBS-1, R-OBS-3: which request, and where its time went (None: did not happen)
    request_id: str = ""
    trace_id: str = ""
    node_id: str | None = None
    queue_wait_s: float | None = None
    ttft_s: float | None = None


class RequestLabels(NamedTuple):
    """The bounded label values of one record."""

    operation: str
    model_group: str
    provider: str
    code: str
    principal_ref: str
    token_ref: str
    attributed_to: str
    attribution: str
    failed: bool


class LabelIndex:
    """The configured ids and refs of one snapshot, for O(1) label checks."""

    __slots__ = ("attribution", "codes", "group_providers", "operations", "prices",
                 "principal_refs", "token_refs")  # fmt: skip

    def __init__(
        self,
        snapshot: EdgeSnapshot,
        operations: Vocabulary,
        codes: Vocabulary,
        routes: Mapping[str, str] | None = None,
    ) -> None:
        self.operations, self.codes = operations, codes
        self.attribution = {mid: m.usage_attribution for mid, m in snapshot.models.items()}
        self.group_providers = {mid: frozenset(m.providers) for mid, m in snapshot.models.items()}
        # R-COST-1: (group, provider or "-") -> (input, output, cached input) per token, in
        # 10^-12 of the currency; the provider's price wins; an unpriced pair costs 0.
        self.prices: dict[tuple[str, str], tuple[int, int, int]] = {}
        for mid, m in snapshot.models.items():
            for pid in (NO_LABEL, *m.providers):
                price = snapshot.price(mid, None if pid == NO_LABEL else pid)
                if price is not None:
                    self.prices[(mid, pid)] = price.per_token_pico()
        # R-MGD-13: managed mode's route ids are its keys (route id -> principal): no token
        # is configured there, so the two never meet.
        self.token_refs = {**(routes or {})}
        self.token_refs.update({t.token_ref: t.principal_ref for t in snapshot.principal_tokens})
        refs = {t.principal_ref for t in snapshot.principal_tokens}
        refs.update(snapshot.principals)  # R-MGD-13: a principal's entry names it
        refs.update(self.token_refs.values())
        self.principal_refs = frozenset(refs)

    def cost_pico(self, lab: RequestLabels, tokens_in: int, cached: int, tokens_out: int) -> int:
        """R-COST-2: the cost of these tokens on the labels' group and provider, in 10^-12 of
        the currency: integers only, so exact (``cached`` is part of ``tokens_in``)."""
        price = self.prices.get((lab.model_group, lab.provider))
        if price is None:
            return 0
        return (tokens_in - cached) * price[0] + tokens_out * price[1] + cached * price[2]

    def known_group(self, group: str) -> bool:
        return group in self.attribution

    def labels(self, record: RequestRecord) -> RequestLabels:
        """Resolve a record to bounded labels and its attribution (R-CFG-4, R-PROF-7b)."""
        group = record.model_group if record.model_group in self.attribution else NO_LABEL
        providers = self.group_providers.get(group, frozenset())
        provider = record.provider_id if record.provider_id in providers else NO_LABEL
        # R-CFG-4: omitted means provider; model_group is the operator's explicit opt-in.
        attribution = self.attribution.get(group, NO_LABEL)
        if attribution == "model_group":
            attributed_to = group
        elif attribution == "provider":
            attributed_to = provider
        else:
            attributed_to = NO_LABEL
        token_ref = record.token_ref if record.token_ref in self.token_refs else NO_LABEL
        if token_ref != NO_LABEL:
            principal_ref = self.token_refs[token_ref]
        elif record.principal_ref in self.principal_refs:
            principal_ref = record.principal_ref
        else:
            principal_ref = NO_LABEL
        failed = record.status >= 400 or (record.code not in (None, "", "ok"))
        return RequestLabels(
            operation=self.operations.word(record.operation),
            model_group=group,
            provider=provider,
            code=self.codes.word(outcome_code(record.status, record.code)) if failed else "ok",
            principal_ref=principal_ref,
            token_ref=token_ref,
            attributed_to=attributed_to,
            attribution=attribution,
            failed=failed,
        )


class Vocabulary:
    """A bounded set of label words: the first ``limit`` distinct ones, then ``other``.

    Operation names and error codes come from the Edge's own closed sets; the bound keeps
    a misbehaving caller of ``record()`` from growing the series without limit.
    """

    __slots__ = ("_limit", "_seen")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._seen: set[str] = set()

    def word(self, value: object) -> str:
        if value in self._seen:
            return value  # type: ignore[return-value]
        word = closed_word(value)
        if word == NO_LABEL or word in self._seen:
            return word
        if len(self._seen) >= self._limit:
            return OTHER
        self._seen.add(word)
        return word


def closed_word(value: object) -> str:
    """A short lowercase identifier (letters, digits, underscores), else ``-``."""
    text = str(value or "").lower()
    return text if _WORD.fullmatch(text) else NO_LABEL


def outcome_code(status: int, code: str | None) -> str:
    """The error code label: the surface's code, else ``http_<status>``."""
    word = closed_word(code) if code else NO_LABEL
    if word != NO_LABEL:
        return word
    return f"http_{int(status)}" if 100 <= int(status) <= 599 else "error"


def token_count(value: object) -> int:
    """A token count for the ledger: a missing, negative, huge or odd figure counts as 0
    (R-IN-6), so one bad value never fails the batch write."""
    return token_figure(value, "metered")
