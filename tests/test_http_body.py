"""Bounded body reading: the limit holds for declared and chunked bodies (413 request_too_large)."""

from __future__ import annotations

from typing import Any

import pytest

from pool.http.body import ClientGone, read_body
from pool.http.errors import HttpError


def messages(*chunks: bytes, disconnect_after: bool = False) -> Any:
    queue: list[dict[str, Any]] = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    if disconnect_after:
        queue[-1]["more_body"] = True
        queue.append({"type": "http.disconnect"})
    taken: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        taken.append(queue.pop(0))
        return taken[-1]

    receive.taken = taken  # type: ignore[attr-defined]
    return receive


async def test_a_single_message_body_is_returned_as_is() -> None:
    assert await read_body(messages(b'{"a":1}'), b"7", 100) == b'{"a":1}'


async def test_chunked_bodies_are_joined() -> None:
    assert await read_body(messages(b"ab", b"cd", b"ef"), None, 100) == b"abcdef"


async def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    receive = messages(b"x" * 10)
    with pytest.raises(HttpError) as caught:
        await read_body(receive, b"101", 100)
    assert caught.value.code == "request_too_large" and caught.value.status == 413
    assert receive.taken == []


async def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit() -> None:
    receive = messages(b"x" * 60, b"x" * 60, b"x" * 60, b"x")
    with pytest.raises(HttpError) as caught:
        await read_body(receive, None, 100)
    assert caught.value.code == "request_too_large"
    assert len(receive.taken) == 2  # the rest is never read


async def test_an_understated_content_length_does_not_bypass_the_limit() -> None:
    with pytest.raises(HttpError):
        await read_body(messages(b"x" * 150), b"10", 100)


async def test_a_body_of_exactly_the_limit_is_accepted() -> None:
    assert len(await read_body(messages(b"x" * 50, b"x" * 50), None, 100)) == 100


async def test_a_bad_content_length_is_an_invalid_request() -> None:
    with pytest.raises(HttpError) as caught:
        await read_body(messages(b"{}"), b"ten", 100)
    assert caught.value.code == "invalid_request"


async def test_a_disconnect_before_the_body_ends_is_client_gone() -> None:
    with pytest.raises(ClientGone):
        await read_body(messages(b"ab", disconnect_after=True), None, 100)
