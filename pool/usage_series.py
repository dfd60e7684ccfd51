"""Usage over time as chart data: ledger rows -> time buckets -> SVG geometry (R-PRIN-4).

Pure functions, no Django: the admin page (``pool/usage_page.py``) queries the ledger and
renders what this returns as inline SVG, server-side (``docs/metering.md``, "Usage charts").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from catalog.config.money import pico_text
from catalog.config.periods import period_bounds

WIDTH, HEIGHT = 640, 150  # the plot area in SVG units, inside the margins below
LEFT, TOP, BOTTOM = 56, 8, 22
MAX_CHARTS = 24  # entities per section: the busiest ones; the page says how many were left out

STEPS = {"hour": timedelta(hours=1), "day": timedelta(days=1)}
# (label, length of the window, bucket step); the first is the default
RANGES: dict[str, tuple[str, timedelta, str]] = {
    "24h": ("last 24 hours, hourly", timedelta(hours=24), "hour"),
    "7d": ("last 7 days, hourly", timedelta(days=7), "hour"),
    "30d": ("last 30 days, daily", timedelta(days=30), "day"),
    "90d": ("last 90 days, daily", timedelta(days=90), "day"),
}
# spend: the cost of rows with reported usage; spend_estimated: of rows the Edge estimated
# (R-COST-2), both in 10^-12 of the currency (integers: exact sums)
METRICS = ("requests", "errors", "input_tokens", "output_tokens", "spend", "spend_estimated")
MONEY = frozenset({"spend", "spend_estimated"})
BUDGET_USED = "budget_used"  # R-BUD-1: tokens (or cost) used in the budget's period so far
PANELS = (
    ("requests", ("requests", "errors")),
    ("tokens", ("input_tokens", "output_tokens")),
    ("spend", ("spend", "spend_estimated")),  # R-COST-2
)


class Row(NamedTuple):
    """One ledger row's figures (already summed over the keys the page does not show)."""

    bucket_start: datetime
    key: str  # a principal_ref or a model group id
    requests: int
    errors: int
    input_tokens: int
    output_tokens: int
    spend: int = 0  # 10^-12 of the currency, rows with reported usage (R-COST-2)
    spend_estimated: int = 0  # the same, of rows whose tokens were estimated


@dataclass(frozen=True, slots=True)
class Budget:
    """A principal's budget as the chart draws it: the limit in tokens or 10^-12 units."""

    limit: int
    period: str
    money: bool = False


@dataclass(frozen=True, slots=True)
class Window:
    """Bucket starts from ``start`` (inclusive) to ``end`` (exclusive), every ``step``."""

    start: datetime
    end: datetime
    step: str

    @property
    def starts(self) -> list[datetime]:
        delta, at, out = STEPS[self.step], self.start, []
        while at < self.end:
            out.append(at)
            at += delta
        return out


def window_for(range_key: str, now: datetime) -> Window:
    """The window of a range ending with the bucket that holds ``now`` (UTC)."""
    _, length, step = RANGES.get(range_key, next(iter(RANGES.values())))
    now = now.astimezone(UTC)
    if step == "day":
        last = now.replace(hour=0, minute=0, second=0, microsecond=0)
    else:
        last = now.replace(minute=0, second=0, microsecond=0)
    end = last + STEPS[step]
    return Window(end - length, end, step)


def bucket_of(at: datetime, step: str) -> datetime:
    at = at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return at.replace(hour=0) if step == "day" else at


@dataclass(frozen=True, slots=True)
class Series:
    metric: str
    values: tuple[int, ...]
    points: str  # SVG polyline points
    total: int
    shown: str = ""  # the total as a person reads it (money as a decimal)


@dataclass(frozen=True, slots=True)
class Panel:
    name: str  # requests | tokens
    series: tuple[Series, ...]
    top: int  # the y axis maximum
    y_ticks: tuple[tuple[float, str], ...]  # (y, label)
    limit: int | None = None  # R-BUD-1: the budget, drawn as a line at ``limit_y``
    limit_y: float | None = None
    limit_shown: str = ""  # the budget as a person reads it
    in_money: bool = False  # figures in 10^-12 of the currency (spend, a budget in money)


@dataclass(frozen=True, slots=True)
class Chart:
    key: str
    totals: dict[str, int]
    panels: tuple[Panel, ...]
    title: str  # what a person reads: the key, or words for the ledger's no-label bucket


@dataclass(frozen=True, slots=True)
class Section:
    charts: tuple[Chart, ...]
    left_out: int  # entities beyond MAX_CHARTS


def nice_top(value: int) -> int:
    """The smallest 1/2/5 x 10^k at or above ``value`` (at least 1): a readable y maximum."""
    top = 1
    while True:
        for factor in (1, 2, 5):
            if top * factor >= value:
                return top * factor
        top *= 10


def short(n: int) -> str:
    """12, 3.4k, 5.6M: axis labels that fit the margin."""
    for size, suffix in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if n >= size:
            return f"{n / size:.1f}".rstrip("0").rstrip(".") + suffix
    return str(n)


def money(n: int) -> str:
    """10^-12 units as the currency's decimal, six places at most (the axis and legends)."""
    return pico_text(n, places=6)


def x_of(index: int, count: int) -> float:
    return LEFT + (WIDTH * index / (count - 1) if count > 1 else WIDTH / 2)


def y_of(value: int, top: int) -> float:
    return TOP + HEIGHT - HEIGHT * value / top


def _panel(
    name: str,
    metrics: tuple[str, ...],
    values: dict[str, list[int]],
    limit: int | None = None,
    in_money: bool = False,
) -> Panel:
    top = nice_top(max((max(values[m], default=0) for m in metrics), default=limit or 0))
    if limit is not None:
        top = nice_top(max(top, limit))
    label = money if in_money else short
    series = []
    for metric in metrics:
        vals = values[metric]
        points = " ".join(
            f"{x_of(i, len(vals)):.1f},{y_of(v, top):.1f}" for i, v in enumerate(vals)
        )
        total = sum(vals)
        shown = money(total) if in_money else str(total)
        series.append(Series(metric, tuple(vals), points, total, shown))
    ticks = tuple((y_of(v, top), label(v)) for v in (0, top // 2, top) if v or top == 0)
    limit_y = None if limit is None else y_of(limit, top)
    limit_shown = "" if limit is None else (money(limit) if in_money else str(limit))
    return Panel(name, tuple(series), top, ticks, limit, limit_y, limit_shown, in_money)


def budget_used(
    values: dict[str, list[int]], starts: list[datetime], budget: Budget, carried: int
) -> list[int]:
    """Tokens (or cost, estimated included, for a budget in money: R-COST-3) used in the
    budget's period up to each bucket, starting again at each period's start; ``carried`` is
    what the period used before the window's first bucket."""
    counted = ("spend", "spend_estimated") if budget.money else ("input_tokens", "output_tokens")
    used, total = [], carried
    for i, start in enumerate(starts):
        at = int(start.timestamp())
        if i and period_bounds(budget.period, at)[0] == at:
            total = 0
        total += values[counted[0]][i] + values[counted[1]][i]
        used.append(total)
    return used


def build_section(
    rows: Iterable[Row],
    window: Window,
    budgets: dict[str, Budget] | None = None,
    carried: dict[str, int] | None = None,
    titles: Mapping[str, str] | None = None,
) -> Section:
    """A chart per key (busiest first by requests, then by key), each over every bucket: its
    requests, tokens and spend; a key with a budget gets one more panel: its period's usage
    and the budget.
    ``titles`` names a key in words (the ledger's ``-``, docs/metering.md)."""
    starts = window.starts
    index = {start: i for i, start in enumerate(starts)}
    per_key: dict[str, dict[str, list[int]]] = {}
    for row in rows:
        at = index.get(bucket_of(row.bucket_start, window.step))
        if at is None:
            continue
        values = per_key.setdefault(row.key, {m: [0] * len(starts) for m in METRICS})
        for metric in METRICS:
            values[metric][at] += getattr(row, metric)
    ranked = sorted(per_key.items(), key=lambda kv: (-sum(kv[1]["requests"]), kv[0]))
    charts = []
    for key, values in ranked[:MAX_CHARTS]:
        panels = tuple(
            _panel(name, metrics, values, in_money=name == "spend") for name, metrics in PANELS
        )
        budget = (budgets or {}).get(key)
        if budget is not None:
            used = budget_used(values, starts, budget, (carried or {}).get(key, 0))
            panels += (
                _panel("budget", (BUDGET_USED,), {BUDGET_USED: used}, budget.limit, budget.money),
            )
        totals = {m: sum(values[m]) for m in METRICS}
        charts.append(Chart(key, totals, panels, (titles or {}).get(key, key)))
    return Section(tuple(charts), max(0, len(ranked) - MAX_CHARTS))


def x_labels(window: Window, every: int = 0) -> list[tuple[float, str]]:
    """Labels under the x axis: about six, hours as ``HH:00`` and days as ``MM-DD``; hourly
    buckets over several days get one date at each midnight."""
    starts = window.starts
    if not starts:
        return []
    if window.step == "hour" and len(starts) > 48:
        # Hourly buckets over days: one date label at each midnight (UTC), so every day
        # gets its label (a fixed stride of buckets would put them 28 hours apart).
        return [
            (x_of(i, len(starts)), start.strftime("%m-%d"))
            for i, start in enumerate(starts)
            if start.hour == 0
        ]
    every = every or max(1, len(starts) // 6)
    fmt = "%m-%d" if window.step == "day" else "%H:00"
    return [
        (x_of(i, len(starts)), start.strftime(fmt))
        for i, start in enumerate(starts)
        if i % every == 0
    ]
