"""The event loop under the Edge (Twisted's asyncio reactor, made by daphne) and the Node
(aiohttp and websockets): uvloop when it is installed, asyncio's own with
``IOP_EVENT_LOOP=asyncio`` (docs/performance-history.md, "uvloop").

``install()`` sets asyncio's event-loop policy, so it must run before the loop is made: for
the Edge before ``daphne.server`` is imported (daphne's Django app imports it while Django
starts, see ``manage.py``), for the Node before ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Mapping

ENV = "IOP_EVENT_LOOP"
CHOICES = ("auto", "uvloop", "asyncio")


class LoopChoiceError(ValueError):
    """``IOP_EVENT_LOOP`` names no loop, or one that is not installed."""


def choose(environ: Mapping[str, str] = os.environ) -> str:
    """``uvloop`` or ``asyncio``: what ``IOP_EVENT_LOOP`` asks for (default ``auto``: uvloop
    when installed)."""
    raw = environ.get(ENV, "")
    value = raw.strip().lower() or "auto"
    if value not in CHOICES:
        raise LoopChoiceError(f"{ENV}: expected one of {', '.join(CHOICES)}, got {raw!r}")
    installed = importlib.util.find_spec("uvloop") is not None
    if value == "uvloop" and not installed:
        raise LoopChoiceError(f"{ENV}=uvloop but uvloop is not installed (pip install uvloop)")
    return "uvloop" if value != "asyncio" and installed else "asyncio"


def install(environ: Mapping[str, str] = os.environ) -> str:
    """Set the event-loop policy ``choose`` names; return its name."""
    name = choose(environ)
    if name == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    else:
        asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
    return name
