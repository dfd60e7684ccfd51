"""The adversarial client of R-LIM-3 against a real Edge, Node and fake upstream: a client that
times its bytes to get around budgets and per-token limits (docs/http-api.md, "Admission";
the cases are listed there). Slow bodies go over raw sockets (``tests.support.rawhttp``):
headers and one body byte now, the rest later.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.support import Stack, token_entries
from tests.support.rawhttp import SlowBody, connect, first_answered, post_head, read_responses
from tests.support.upstream_loop import Hold

pytestmark = pytest.mark.slow

USED = 11 + 7  # the fake upstream's usage per chat completion (prompt + completion)
CHAT = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
PATH = "/v1/chat/completions"
CAP = 64  # models[].max_output_tokens (R-LIM-5)
BUDGET = {"tokens": USED, "period": "day"}  # one chat completion spends it
# name -> (principal, policy)
TOKENS: dict[str, tuple[str, dict[str, Any]]] = {
    "slow": ("team-budget", {"max_in_flight": 1, "budget": BUDGET, "max_pending_bodies": 4}),
    "spender": ("team-budget", {"budget": BUDGET}),
    "holder": ("team-holder", {}),
    "narrow": ("team-narrow", {"max_pending_bodies": 2}),
    "single": ("team-single", {"max_in_flight": 1, "max_pending_bodies": 2}),
    "bystander": ("team-bystander", {}),
    "pair-a": ("team-pair", {"max_pending_bodies": 1}),
    "pair-b": ("team-pair", {}),
    "piper": ("team-pipe", {"budget": BUDGET}),
    "cutter": ("team-cut", {}),
}
PRINCIPALS = [{"id": "team-pair", "max_in_flight": 1}]  # R-MGD-13: over both its tokens
RAW = {name: f"iop-adversary-{name}-{'z' * 16}" for name in TOKENS}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tokens = token_entries(TOKENS, RAW)
    models = [
        {
            "id": "gpt-test",
            "providers": {"p-openai": "served-gpt"},
            "max_output_tokens": CAP,
            "translate": True,  # Messages served by translation on the Chat provider
        }
    ]
    openai = {"principal_tokens": tokens}
    directory = tmp_path_factory.mktemp("adversary")
    with Stack(directory, openai=openai, models=models, principals=PRINCIPALS) as up:
        yield up


@pytest.fixture(autouse=True)
def idle_after(stack: Stack) -> Iterator[None]:
    with stack.clean_slate():
        yield


def chat(stack: Stack, name: str) -> openai.types.chat.ChatCompletion:
    with openai.OpenAI(base_url=stack.v1_url, api_key=RAW[name], max_retries=0) as client:
        return client.chat.completions.create(**CHAT)  # type: ignore[call-overload, no-any-return]


@contextlib.contextmanager
def slow_bodies(stack: Stack, name: str, count: int) -> Iterator[list[SlowBody]]:
    held = [SlowBody(stack.ports["openai"], PATH, RAW[name], CHAT) for _ in range(count)]
    try:
        yield held
    finally:
        for body in held:
            body.close()


def refusal(answer: tuple[int, dict[str, str], bytes]) -> tuple[int, str]:
    status, _, body = answer
    return status, json.loads(body)["error"]["code"]


def pending(stack: Stack, name: str, opened: list[SlowBody], held: int) -> list[SlowBody]:
    """Of ``opened`` bodies of a token whose ``max_pending_bodies`` is ``held``, the ones the
    Edge holds: every other one is answered 429 at its headers (R-LIM-2). Knowing which is
    the synchronisation: the held ones are counted by the Edge from then on."""
    refused = first_answered(opened, len(opened) - held)
    assert {refusal(answer) for answer in refused.values()} == {(429, "rate_limited")}
    for _, headers, body in refused.values():
        assert "max_pending_bodies" in json.loads(body)["error"]["message"]
        assert headers["retry-after"] == "1"
    return [body for index, body in enumerate(opened) if index not in refused]


def until_budget_spent(stack: Stack, name: str) -> None:
    """Bounded: the spending request's meter record lands right after its answer."""
    deadline = time.monotonic() + 10
    while True:
        try:
            chat(stack, name)
        except openai.RateLimitError as refused:
            assert refused.code == "budget_exceeded"
            return
        assert time.monotonic() < deadline, "the budget was never spent"


def test_slow_bodies_sent_after_the_budget_was_spent_get_429_budget_exceeded_r_lim_1(
    stack: Stack,
) -> None:
    """R-LIM-1, the review's reproduction: ``max_in_flight: 1``, four requests send their
    headers and one body byte, a fresh request of the same principal spends the budget,
    then the four bodies are finished one after another: each gets 429 budget_exceeded
    (they had passed the budget check with their headers)."""
    with slow_bodies(stack, "slow", 5) as opened:
        held = pending(stack, "slow", opened, 4)
        assert chat(stack, "spender").usage.total_tokens == USED  # type: ignore[union-attr]
        until_budget_spent(stack, "spender")
        answers = [body.finish() for body in held]
    assert [refusal(a) for a in answers] == [(429, "budget_exceeded")] * 4
    for _, headers, _ in answers:
        assert headers["x-budget-remaining-tokens"] == "0"
        assert int(headers["retry-after"]) >= 1


def test_a_body_still_arriving_counts_in_flight_r_lim_1(stack: Stack) -> None:
    """R-LIM-1: a request counts against ``max_in_flight`` from its authenticated headers:
    of two bodies of a ``max_in_flight: 1`` token still arriving, the one finished first is
    refused 429 rate_limited (the other counts in flight); the other, finished next, is
    served."""
    with slow_bodies(stack, "single", 3) as opened:
        first, second = pending(stack, "single", opened, 2)
        status, _, body = first.finish()
        assert (status, json.loads(body)["error"]["code"]) == (429, "rate_limited")
        assert "max_in_flight" in json.loads(body)["error"]["message"]
        assert second.finish()[0] == 200
    assert chat(stack, "single").choices[0].message.content


def test_the_ninth_body_still_arriving_is_refused_before_its_body_r_lim_2(stack: Stack) -> None:
    """R-LIM-2: one token opens 300 connections that each send headers and one body byte.
    8 of them (the documented default) wait for their bodies; every other one is answered
    429 rate_limited at once, its body never sent. Meanwhile the Edge serves other tokens,
    and the 8 held bodies, once finished, are served too."""
    with slow_bodies(stack, "holder", 300) as opened:
        held = pending(stack, "holder", opened, 8)
        assert chat(stack, "bystander").choices[0].message.content
        assert [body.finish()[0] for body in held] == [200] * 8
    assert chat(stack, "holder").choices[0].message.content


def test_max_pending_bodies_is_the_tokens_own_when_set_r_lim_2(stack: Stack) -> None:
    """R-LIM-2: ``max_pending_bodies: 2`` on a token: its third body still arriving is
    refused with Retry-After, and a finished one makes room again."""
    with slow_bodies(stack, "narrow", 3) as opened:
        first, second = pending(stack, "narrow", opened, 2)
        assert first.finish()[0] == 200
        with slow_bodies(stack, "narrow", 1) as again:
            assert again[0].finish()[0] == 200
        assert second.finish()[0] == 200


def test_pipelined_requests_are_each_decided_when_their_turn_comes_r_lim_3(
    stack: Stack,
) -> None:
    """R-LIM-3: four requests pipelined in one write on one connection (three chats and a
    count_tokens) with budget for one: the first is served, and each later one, decided
    after the one before it ended, gets 429 budget_exceeded; the overshoot is nil."""
    paths = [PATH, PATH, PATH, "/v1/messages/count_tokens"]
    wire = b""
    for path in paths:
        body = json.dumps(CHAT).encode()
        wire += post_head(path, RAW["piper"], len(body)) + body
    with connect(stack.ports["openai"]) as sock:
        sock.sendall(wire)
        answers = read_responses(sock, len(paths))
    assert answers[0][0] == 200
    assert [refusal(a) for a in answers[1:3]] == [(429, "budget_exceeded")] * 2
    status, headers, body = answers[3]  # count_tokens: the Anthropic shape
    assert (status, json.loads(body)["error"]["type"]) == (429, "rate_limit_error")
    assert headers["x-budget-remaining-tokens"] == "0"


def test_a_principal_s_max_in_flight_counts_a_body_arriving_on_another_token_r_mgd_13(
    stack: Stack,
) -> None:
    """R-MGD-13, R-LIM-1: ``principals: [{id: team-pair, max_in_flight: 1}]``: while a body
    of one of its tokens still arrives, a request on its other token is refused 429
    rate_limited naming the principal; once that body is answered, the other token is
    served."""
    with slow_bodies(stack, "pair-a", 2) as opened:
        (held,) = pending(stack, "pair-a", opened, 1)
        with pytest.raises(openai.RateLimitError) as refused:
            chat(stack, "pair-b")
        assert refused.value.code == "rate_limited"
        assert "principal (max_in_flight)" in refused.value.message
        assert held.finish()[0] == 200
    assert chat(stack, "pair-b").choices[0].message.content


def test_a_request_asking_for_more_output_than_the_group_allows_is_capped_r_lim_5(
    stack: Stack,
) -> None:
    """R-LIM-5: with ``max_output_tokens: 64`` on the group, ``max_tokens: 100000`` reaches
    the upstream as 64, a request with no bound gets 64, a smaller bound is kept and a bound
    that is not a positive integer is 400 invalid_request naming the field."""
    asked: list[dict[str, Any]] = [
        {"max_tokens": 100_000},
        {},
        {"max_completion_tokens": 10},
    ]
    with openai.OpenAI(base_url=stack.v1_url, api_key=RAW["bystander"], max_retries=0) as client:
        for extra in asked:
            client.chat.completions.create(**CHAT, **extra)  # type: ignore[call-overload]
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(**CHAT, max_tokens=-5)  # type: ignore[call-overload]
    assert refused.value.code == "invalid_request" and refused.value.param == "max_tokens"
    seen = [r.json for r in stack.upstream().server.requests if r.json][-3:]
    assert [(b.get("max_tokens"), b.get("max_completion_tokens")) for b in seen] == [
        (CAP, None),
        (CAP, None),
        (None, 10),
    ]


def test_a_translated_request_is_capped_before_translation_r_lim_5(stack: Stack) -> None:
    """R-LIM-5 on a translated request (R-LIM-3): an Anthropic Messages request asking for
    ``max_tokens: 10000`` of a group served on a Chat Completions provider reaches the
    upstream as a chat request bounded by the group's cap."""
    with anthropic.Anthropic(
        base_url=stack.openai_url, api_key=RAW["bystander"], max_retries=0
    ) as client:
        client.messages.create(
            model="gpt-test", max_tokens=10_000, messages=[{"role": "user", "content": "hi"}]
        )
    last = [r for r in stack.upstream().server.requests if r.json][-1]
    assert last.json["max_tokens"] == CAP and "messages" in last.json


def test_a_stream_cut_before_the_usage_is_charged_as_documented_r_lim_4(stack: Stack) -> None:
    """R-LIM-4: a client cuts a stream after its first event, while the upstream holds the
    rest: the request is metered once, estimated, the input estimate of its body plus the
    text it was relayed (4 characters a token, docs/metering.md), and the upstream was
    asked for at most the group's ``max_output_tokens``: what can escape is bounded."""
    body = json.dumps({**CHAT, "stream": True}).encode()
    head = post_head(PATH, RAW["cutter"], len(body))
    hold = Hold(stack.upstream())
    try:
        with connect(stack.ports["openai"]) as sock:
            sock.sendall(head + body)
            received = b""
            while b"\n\n" not in received.partition(b"data: {")[2]:  # one whole event
                chunk = sock.recv(65536)
                assert chunk, "closed before the first event"
                received += chunk
        hold.wait_streaming()
    finally:
        hold.release()
    events = [line[6:] for line in received.split(b"\n") if line.startswith(b"data: {")]
    text = sum(len(json.loads(e)["choices"][0]["delta"].get("content") or "") for e in events)
    stack.wait_until(
        lambda _: any(r["principal_ref"] == "team-cut" for r in stack.ledger()),
        what="the cut stream's ledger row",
    )
    (row,) = [r for r in stack.ledger() if r["principal_ref"] == "team-cut"]
    assert (row["requests"], row["estimated"]) == (1, 1)
    assert row["input_tokens"] == (len(body) + 3) // 4
    assert row["output_tokens"] == (text + 3) // 4
    asked = [r.json for r in stack.upstream().server.requests if r.json and r.json.get("stream")]
    assert asked[-1]["max_tokens"] == CAP
