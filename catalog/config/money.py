"""Money in the config (R-COST-1, R-COST-3): prices and budget amounts as exact decimals.

A figure is written as a YAML/JSON number or a string (``0.15``, ``"0.15"``); it becomes a
``Decimal`` read from its shortest decimal text, never through binary floating point, with at
most ``PLACES`` decimal places, at least 0 and at most ``MAX_PRICE`` (a price per million
tokens) or ``MAX_AMOUNT`` (a budget). With six places a price per million tokens is an exact
whole number of ``PICO`` (10^-12 of the currency) per token, so the meter multiplies integers
and the ledger sums integers: no rounding at all until a figure is shown (docs/metering.md).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

PLACES = 6  # decimal places of a price or an amount
PICO = 10**12  # ledger and budget figures are integers in 10^-12 of metering.currency
PER_MILLION = 10**6
MAX_PRICE = Decimal(10**6)  # per million tokens
MAX_AMOUNT = Decimal(10**9)  # a budget per period
MAX_PICO = 2**63 - 1  # a 64-bit column: a figure past it is stored as this (saturated)
DEFAULT_CURRENCY = "USD"
CURRENCY_PATTERN = r"[A-Z]{3}"  # ISO 4217-like: three uppercase letters
_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?")


class MoneyError(ValueError):
    """A figure that is not a plain, bounded, non-negative decimal."""


def decimal_figure(value: object, maximum: Decimal) -> Decimal:
    """``value`` (int, float or string) as an exact ``Decimal``, or raise ``MoneyError``."""
    if isinstance(value, bool):
        raise MoneyError("must be a number")
    if isinstance(value, int):
        text = str(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise MoneyError("must be a finite number")
        text = repr(value)  # the shortest text that reads back as this float: 0.15, not 0.1499..
    elif isinstance(value, str):
        text = value.strip()
    else:
        raise MoneyError("must be a number (or a string holding one)")
    if text.startswith("-"):
        raise MoneyError("must be >= 0")
    try:
        figure = Decimal(text)
    except InvalidOperation:
        raise MoneyError("must be a number (or a string holding one)") from None
    if not figure.is_finite():
        raise MoneyError("must be a finite number")
    if figure > maximum:
        raise MoneyError(f"must be <= {maximum}")
    exponent = figure.normalize().as_tuple().exponent
    if isinstance(exponent, int) and -exponent > PLACES:
        raise MoneyError(f"must have at most {PLACES} decimal places")
    if not _NUMBER.fullmatch(format(figure, "f")):
        raise MoneyError("must be a plain decimal number")
    return figure


def to_pico(figure: Decimal) -> int:
    """An amount of the currency in ``PICO`` units (exact for figures of ``PLACES`` places)."""
    return int(figure * PICO)


def per_token_pico(price_per_million: Decimal) -> int:
    """A price per million tokens as ``PICO`` units per token (exact: 10^12 / 10^6)."""
    return int(price_per_million * (PICO // PER_MILLION))


def from_pico(units: int) -> Decimal:
    """``PICO`` units as an exact ``Decimal`` of the currency (for showing, never for sums)."""
    return Decimal(units).scaleb(-12)


def pico_text(units: int, places: int = 12) -> str:
    """``PICO`` units as decimal text with integer arithmetic only (no Decimal: the budget
    headers are built on the request path): at most ``places`` decimals, rounded toward zero,
    trailing zeros dropped (``25``, ``24.99985``)."""
    sign = "-" if units < 0 else ""
    whole, frac = divmod(abs(units), PICO)
    digits = f"{frac:012d}"[:places].rstrip("0")
    return f"{sign}{whole}.{digits}" if digits else f"{sign}{whole}"
