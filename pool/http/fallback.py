"""Fallbacks between model groups (R-FALL-1): a loop around admission, one level out from
failover (which moves between the providers of one group, R-HEALTH-1).

A request is served by the group it names; when that group cannot serve it before its first
byte (``no_available_provider``: every candidate offline, disabled, ejected or refused; or
``context_length_exceeded``: no provider of the group can hold it), it is admitted on the next
group of the chain (``ModelGroupSpec.fallbacks``) that the caller's scope includes, under that
group's mapping, capabilities and translation. Every other outcome stands. The caller's limits
and budget were charged once, before the loop. The answer keeps the caller's ``model``;
``x-iop-model-group`` names the group that served it.

In managed mode a route key is bound to one group and holds slots for its providers only, so
its requests never fall back (docs/pool.md, "Fallbacks").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from pool.http.auth import Caller
from pool.http.errors import HttpError
from pool.http.operations import ParsedRequest
from pool.http.relay import Exchange
from pool.http.tables import Tables
from pool.translate.plan import translated_needs

FALLBACK_CODES = frozenset(
    {"no_available_provider", "context_length_exceeded", "queue_wait_exceeded"}  # R-QUEUE-2
)
GROUP_HEADER = b"x-iop-model-group"

# Runs one group's admission and answer: (the request as that group serves it, long-context).
Run = Callable[[ParsedRequest, bool], Awaitable[None]]


class Served:
    """Which group a request was asked of and which one served it (metering records both)."""

    __slots__ = ("asked", "group")

    def __init__(self, asked: str) -> None:
        self.asked = asked
        self.group = asked


def chain_of(tables: Tables, request: ParsedRequest, caller: Caller, managed: bool) -> list[str]:
    """The groups to try, in order: the asked one, then its fallbacks in the caller's scope."""
    group = tables.snapshot.models.get(request.model)
    if group is None or managed or not group.fallbacks:
        return [request.model]
    return [request.model, *(g for g in group.fallbacks if caller.may_use(g))]


async def serve(
    tables: Tables,
    request: ParsedRequest,
    groups: list[str],
    ex: Exchange,
    served: Served,
    run: Run,
) -> None:
    """Serve ``request`` on the first group of ``groups`` that can take it (R-FALL-1); when
    none can, the asked group's own refusal stands."""
    needs, base_headers = request.needs, ex.extra_headers
    first: HttpError | None = None
    for index, group in enumerate(groups):
        attempt = request
        if index:
            attempt = dataclasses.replace(request, model=group, asked=request.model)
        # R-XLATE-1: admission counts translations, per group
        translating = group in tables.translating
        attempt.needs = (
            translated_needs(needs, request.endpoint.capability) if translating else needs
        )
        served.group = group
        if group in tables.snapshot.models:  # a configured id only: caller text is never echoed
            ex.extra_headers = [*base_headers, (GROUP_HEADER, group.encode())]
        long = request.input_tokens_estimate >= tables.long_threshold  # R-POOL-7
        try:
            tables.check_fits(group, request.input_tokens_estimate, long)  # R-IN-4
            await run(attempt, long)
            return
        except HttpError as err:
            if err.code not in FALLBACK_CODES or ex.started:
                raise
            first = first or err
    served.group, ex.extra_headers = request.model, base_headers
    assert first is not None
    raise first
