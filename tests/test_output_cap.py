"""``models[].max_output_tokens`` on each client API's bound field (R-LIM-5), without a
stack; the end-to-end case is in tests/test_limits_adversary_e2e.py."""

from __future__ import annotations

import json

import pytest

from pool.http.errors import HttpError
from pool.http.operations import ENDPOINTS, ParsedRequest, parse_request
from pool.http.output_cap import capped


def request(path: str, **fields: object) -> ParsedRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    if path == "/v1/messages":
        body.setdefault("max_tokens", 1)
    return parse_request(ENDPOINTS[path], json.dumps(body).encode())


@pytest.mark.parametrize(
    ("path", "fields", "expected"),
    [
        ("/v1/chat/completions", {"max_tokens": 500}, {"max_tokens": 100}),
        ("/v1/chat/completions", {"max_completion_tokens": 500}, {"max_completion_tokens": 100}),
        ("/v1/chat/completions", {}, {"max_tokens": 100}),
        ("/v1/chat/completions", {"max_tokens": 7}, {"max_tokens": 7}),
        ("/v1/responses", {"max_output_tokens": 10**6}, {"max_output_tokens": 100}),
        ("/v1/responses", {}, {"max_output_tokens": 100}),
        ("/v1/messages", {"max_tokens": 4096}, {"max_tokens": 100}),
    ],
)
def test_a_bound_over_the_cap_or_missing_becomes_the_cap(
    path: str, fields: dict[str, int], expected: dict[str, int]
) -> None:
    """R-LIM-5: each API's output bound is capped, or set when missing; the caller's own
    body is left as it was (a fallback group with another cap starts from it)."""
    original = request(path, **fields)
    out = capped(original, 100)
    assert {k: out.data[k] for k in expected} == expected
    assert {k: original.data.get(k) for k in fields} == fields


def test_no_cap_or_count_tokens_changes_nothing() -> None:
    """R-LIM-5: without a cap, and on count_tokens (no output), the request is the same."""
    plain = request("/v1/chat/completions", max_tokens=10**6)
    assert capped(plain, None) is plain
    count = request("/v1/messages/count_tokens")
    assert capped(count, 5) is count


@pytest.mark.parametrize("value", [0, -1, "100", 2.5, True])
def test_a_bound_that_is_not_a_positive_integer_is_refused_naming_the_field(
    value: object,
) -> None:
    """R-LIM-5: the Edge cannot cap what it cannot read: 400 invalid_request, param named."""
    with pytest.raises(HttpError) as refused:
        capped(request("/v1/chat/completions", max_completion_tokens=value), 100)
    assert (refused.value.code, refused.value.param) == ("invalid_request", "max_completion_tokens")
