"""The adversarial client of R-LIM-3 against fallbacks (R-FALL-1), through a real Edge, Node
and fake upstream: a request of ``front`` (its one provider disabled) is served by ``back``.
A fallback is no way around a budget, ``max_in_flight`` or an output cap: the caller's limits
and budget are decided once, before the chain, and each attempt is capped by the group that
serves it (docs/http-api.md, "Admission", lists the cases)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support import Stack, token_entries
from tests.support.rawhttp import SlowBody, connect, first_answered, post_head
from tests.support.upstream_loop import Hold

pytestmark = pytest.mark.slow

USED = 11 + 7  # the fake upstream's usage per chat completion (prompt + completion)
PATH = "/v1/chat/completions"
FRONT_CAP, BACK_CAP = 64, 32  # models[].max_output_tokens of each group (R-LIM-5)
CHAT: dict[str, Any] = {"model": "front", "messages": [{"role": "user", "content": "hi"}]}
DAY = "day"
# name -> (principal, policy)
TOKENS: dict[str, tuple[str, dict[str, Any]]] = {
    "slow": ("team-spent", {"budget": {"tokens": USED, "period": DAY}, "max_pending_bodies": 3}),
    "spender": ("team-spent", {"budget": {"tokens": USED, "period": DAY}}),
    "single": ("team-single", {"max_in_flight": 1}),
    "counted": ("team-counted", {"budget": {"tokens": 3 * USED, "period": DAY}}),
    "capped": ("team-capped", {}),
}
RAW = {name: f"iop-fallback-adversary-{name}-{'q' * 16}" for name in TOKENS}
PROVIDERS = [
    {"id": "p-off", "profile": "openai", "base_url": "{up:main}/v1", "enabled": False},
    {"id": "p-on", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 4},
]
MODELS = [
    {"id": "front", "providers": {"p-off": "served-front"}, "fallbacks": ["back"],
     "max_output_tokens": FRONT_CAP},
    {"id": "back", "providers": {"p-on": "served-back"}, "max_output_tokens": BACK_CAP},
]  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tokens = token_entries(TOKENS, RAW)
    directory = tmp_path_factory.mktemp("adversary-fallback")
    with Stack(
        directory, providers=PROVIDERS, models=MODELS, openai={"principal_tokens": tokens}
    ) as up:
        yield up


@pytest.fixture(autouse=True)
def idle_after(stack: Stack) -> Iterator[None]:
    with stack.clean_slate():
        yield


def chat(stack: Stack, name: str, **extra: Any) -> Any:
    """The raw answer of one chat completion (headers and the parsed completion)."""
    with openai.OpenAI(base_url=stack.v1_url, api_key=RAW[name], max_retries=0) as client:
        return client.chat.completions.with_raw_response.create(**{**CHAT, **extra})


def upstream_bodies(stack: Stack) -> list[dict[str, Any]]:
    return [r.json for r in stack.upstream().server.requests if r.json]


def ledger_rows(stack: Stack, principal: str) -> list[dict[str, Any]]:
    stack.wait_until(
        lambda _: any(r["principal_ref"] == principal for r in stack.ledger()),
        what=f"the ledger row of {principal}",
    )
    return [r for r in stack.ledger() if r["principal_ref"] == principal]


def test_slow_bodies_of_a_falling_back_group_are_refused_once_the_budget_is_spent_r_lim_3(
    stack: Stack,
) -> None:
    """R-LIM-3 (fallbacks), R-LIM-1: two bodies of ``front`` are still arriving when another
    token of the principal spends the budget on a request ``back`` serves; finished, both get
    429 budget_exceeded, and neither reaches any group's upstream (the refusal is no reason
    to fall back)."""
    opened = [SlowBody(stack.ports["openai"], PATH, RAW["slow"], CHAT) for _ in range(4)]
    try:
        refused = first_answered(opened, 1)  # max_pending_bodies: 3, so one is refused
        held = [body for index, body in enumerate(opened) if index not in refused][:2]
        raw = chat(stack, "spender")
        assert raw.headers["x-iop-model-group"] == "back"
        ledger_rows(stack, "team-spent")  # recorded: the budget is spent from here on
        sent = len(upstream_bodies(stack))
        answers = [body.finish() for body in held]
    finally:
        for body in opened:
            body.close()
    for status, headers, answer in answers:
        assert (status, json.loads(answer)["error"]["code"]) == (429, "budget_exceeded")
        assert headers["x-budget-remaining-tokens"] == "0"
    assert len(upstream_bodies(stack)) == sent


def test_a_request_a_fallback_serves_counts_once_in_flight_r_lim_3(stack: Stack) -> None:
    """R-LIM-3 (fallbacks), R-LIM-1: a ``max_in_flight: 1`` token's stream of ``front``,
    served by ``back`` and held by the upstream, is its one request in flight: a request of
    ``back`` itself is refused 429 rate_limited; once the stream ends, the token is served
    again, and the ledger charges the held stream once and the refusal nothing."""
    body = json.dumps({**CHAT, "stream": True}).encode()
    head = post_head(PATH, RAW["single"], len(body))
    hold = Hold(stack.upstream())
    try:
        with connect(stack.ports["openai"]) as sock:
            sock.sendall(head + body)
            hold.wait_streaming()
            with pytest.raises(openai.RateLimitError) as refused:
                chat(stack, "single", model="back")
            assert refused.value.code == "rate_limited"
            assert "max_in_flight" in refused.value.message
            hold.release()
            received = b""
            while b"data: [DONE]" not in received:
                chunk = sock.recv(65536)
                assert chunk, "closed before the stream ended"
                received += chunk
    finally:
        hold.release()
    assert b"x-iop-model-group: back" in received.lower()
    rows = ledger_rows(stack, "team-single")
    (row,) = [r for r in rows if not r["errors"]]  # the refusal is an error row, no tokens
    assert (row["requests"], row["requested_group"], row["model_group"]) == (1, "front", "back")
    assert (row["input_tokens"], row["output_tokens"]) == (11, 7)
    assert sum(r["input_tokens"] + r["output_tokens"] for r in rows if r["errors"]) == 0
    assert chat(stack, "single", model="back").headers["x-iop-model-group"] == "back"


def test_a_request_a_fallback_serves_is_charged_once_r_lim_3(stack: Stack) -> None:
    """R-LIM-3 (fallbacks), R-BUD-1: a budget of three requests' tokens; one request of
    ``front`` served by ``back`` is charged its usage once: the next request is admitted
    with exactly two requests' tokens left."""
    first = chat(stack, "counted")
    assert first.headers["x-budget-remaining-tokens"] == str(3 * USED)
    assert first.headers["x-iop-model-group"] == "back"
    ledger_rows(stack, "team-counted")
    second = chat(stack, "counted")
    assert second.headers["x-budget-remaining-tokens"] == str(2 * USED)


def test_a_fallback_attempt_is_capped_by_the_group_that_serves_it_r_lim_5(stack: Stack) -> None:
    """R-LIM-5 (fallbacks): ``max_tokens: 100000`` asked of ``front`` (cap 64) reaches the
    upstream as ``back``'s cap (32): a client cannot reach a larger bound through a chain,
    and one asking less keeps its own."""
    chat(stack, "capped", max_tokens=100_000)
    chat(stack, "capped", max_tokens=10)
    seen = upstream_bodies(stack)[-2:]
    assert [(b["model"], b["max_tokens"]) for b in seen] == [
        ("served-back", BACK_CAP),
        ("served-back", 10),
    ]
