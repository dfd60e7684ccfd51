"""``models[].max_output_tokens`` (R-LIM-5): a known worst case per request.

A request to a group with a cap that asks for more output than the cap is capped to it; a
request that asks for no bound gets the cap; a bound that is not a positive integer is 400
``invalid_request`` naming the field (the Edge could not know what it allows). Applied per
attempt, so a fallback group's own cap holds for it (R-FALL-1). The caller's body is never
changed in place: a capped request gets its own copy of the top-level fields.
"""

from __future__ import annotations

import dataclasses

from pool.http.errors import HttpError
from pool.http.operations import ParsedRequest

# The output bound of each client API: the fields read, and the field set when none is.
# Chat Completions has two; ``max_tokens`` is the one every OpenAI-compatible server reads.
BOUND_FIELDS: dict[str, tuple[tuple[str, ...], str]] = {
    "chat_completions": (("max_completion_tokens", "max_tokens"), "max_tokens"),
    "responses": (("max_output_tokens",), "max_output_tokens"),
    "messages": (("max_tokens",), "max_tokens"),
}


def capped(request: ParsedRequest, cap: int | None) -> ParsedRequest:
    """``request`` with its output bound at most ``cap`` (None: unchanged)."""
    fields = BOUND_FIELDS.get(request.endpoint.operation)
    if cap is None or fields is None:  # count_tokens produces no output
        return request
    names, default = fields
    data = request.data
    changes: dict[str, int] = {}
    bounded = False
    for name in names:
        value = data.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise HttpError("invalid_request", f"'{name}' must be a positive integer", name)
        bounded = True
        if value > cap:
            changes[name] = cap
    if not bounded:
        changes[default] = cap
    if not changes:
        return request
    return dataclasses.replace(request, data={**data, **changes})
