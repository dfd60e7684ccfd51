"""Complete streams are metered with the upstream's usage (R-BUD-2): a client that closes at
once after the terminal event (``[DONE]``, ``message_stop``, ``response.completed``), while the
upstream still holds its end of the exchange open, on every streamed operation and every
translation direction, through a real Edge and Node."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import Stack
from tests.support.translation import PROVIDER_KEY, metric, translation_stack

pytestmark = pytest.mark.slow

LINGER_S = 1.0  # the upstream keeps the response open this long after its last event
CHAT_USAGE, CLAUDE_USAGE = (11, 7), (17, 9)  # the fakes' reported usage (in, out)
USER = [{"role": "user", "content": "hi"}]

# (path, model group, body extra, terminal event, the upstream usage it is metered with)
CASES = [
    ("/v1/chat/completions", "chat-plain", {"stream_options": {"include_usage": True}},
     b"data: [DONE]", CHAT_USAGE),
    ("/v1/chat/completions", "gpt-over-claude", {"stream_options": {"include_usage": True}},
     b"data: [DONE]", CLAUDE_USAGE),
    ("/v1/messages", "gpt-over-claude", {"max_tokens": 64}, b"event: message_stop", CLAUDE_USAGE),
    ("/v1/messages", "claude-over-chat", {"max_tokens": 64}, b"event: message_stop", CHAT_USAGE),
    ("/v1/responses", "chat-plain", {}, b"event: response.completed", CHAT_USAGE),
    ("/v1/responses", "responses-over-glm", {}, b"event: response.completed", CHAT_USAGE),
]  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with translation_stack(tmp_path_factory.mktemp("complete")) as running:
        running.upstream("claude").server.api_key = PROVIDER_KEY
        yield running


def read_until_then_close(stack: Stack, path: str, body: dict[str, Any], mark: bytes) -> bytes:
    """A raw HTTP/1.1 client that closes its socket the moment ``mark`` arrives."""
    raw = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {stack.token}\r\n"
        f"anthropic-version: 2023-06-01\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(raw)}\r\n\r\n"
    ).encode()
    received = b""
    with socket.create_connection(("127.0.0.1", stack.ports["openai"]), timeout=10) as sock:
        sock.sendall(head + raw)
        while mark not in received:
            data = sock.recv(65536)
            assert data, f"the stream ended before {mark!r}: {received[-500:]!r}"
            received += data
    return received


def counted(stack: Stack, group: str) -> dict[str, float]:
    return {
        "requests": metric(stack, "iop_requests_total", model_group=group),
        "ok": metric(stack, "iop_requests_total", model_group=group, code="ok"),
        "in": metric(stack, "iop_tokens_total", model_group=group, direction="in",
                     estimated="false"),
        "out": metric(stack, "iop_tokens_total", model_group=group, direction="out",
                      estimated="false"),
        "estimated": metric(stack, "iop_tokens_total", model_group=group, estimated="true"),
    }  # fmt: skip


@pytest.mark.parametrize(("path", "group", "extra", "mark", "usage"), CASES)
def test_a_client_closing_right_after_the_terminal_event_is_metered_complete_r_bud_2(
    stack: Stack,
    path: str,
    group: str,
    extra: dict[str, Any],
    mark: bytes,
    usage: tuple[int, int],
) -> None:
    """R-BUD-2: the stream reached its terminal event, so it is complete (code ok, not
    client_closed) and metered with the upstream's usage, not an estimate."""
    with stack.clean_slate():
        for name in ("main", "claude"):
            stack.upstream(name).server.faults.linger_after_end = LINGER_S
        before = counted(stack, group)
        body = {"model": group, "stream": True, **extra}
        body["input" if path == "/v1/responses" else "messages"] = (
            "hi" if path == "/v1/responses" else USER
        )
        received = read_until_then_close(stack, path, body, mark)
        assert received.startswith(b"HTTP/1.1 200")
        deadline = time.monotonic() + 15
        while counted(stack, group)["requests"] == before["requests"]:
            assert time.monotonic() < deadline, stack.logs()[-3000:]
            time.sleep(0.05)
        after = counted(stack, group)
    assert after["ok"] - before["ok"] == 1, stack.logs()[-3000:]
    assert (after["in"] - before["in"], after["out"] - before["out"]) == usage
    assert after["estimated"] == before["estimated"]
