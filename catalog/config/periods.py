"""Budget periods (R-BUD-1): UTC calendar days, ISO weeks (from Monday) and months."""

from __future__ import annotations

import calendar
from datetime import UTC, datetime, timedelta

PERIODS = ("day", "week", "month")


def period_bounds(period: str, now_s: float) -> tuple[int, int]:
    """The UTC calendar period holding ``now_s``: (start, end) in epoch seconds. Weeks start
    on Monday (ISO 8601)."""
    now = datetime.fromtimestamp(now_s, tz=UTC)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        start, end = day, day + timedelta(days=1)
    elif period == "week":
        start = day - timedelta(days=day.weekday())
        end = start + timedelta(days=7)
    elif period == "month":
        start = day.replace(day=1)
        end = start + timedelta(days=calendar.monthrange(start.year, start.month)[1])
    else:
        raise ValueError(f"unknown budget period {period!r}")
    return int(start.timestamp()), int(end.timestamp())
