"""Cache affinity inside exact capacity (R-AFF-1) on a real Edge, Node and three fake
upstreams (one per provider, so each upstream's log says which provider ran a turn): the
turns of 20 conversations land on their first provider whenever it has a free slot, keyed by
``prompt_cache_key`` or by the conversation's head; without affinity they spread; under
concurrency no provider ever runs more than its capacity; hits and misses are counted."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import Stack
from tests.support.translation import metric

pytestmark = pytest.mark.slow

UPSTREAMS = {"u1": "openai", "u2": "openai", "u3": "openai"}
PROVIDERS = [
    {"id": f"p{i}", "profile": "openai", "base_url": f"{{up:u{i}}}/v1", "capacity": 2}
    for i in (1, 2, 3)
]
ALL = {f"p{i}": "served" for i in (1, 2, 3)}
MODELS = [
    {"id": "sticky", "providers": ALL, "affinity": {"key": "prompt_cache_key", "ttl_s": 300}},
    {"id": "sticky-prefix", "providers": ALL, "affinity": {"key": "prefix", "ttl_s": 300}},
    {"id": "spread", "providers": ALL},
]
CONVERSATIONS, TURNS = 20, 3


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(
        tmp_path_factory.mktemp("affinity"), upstreams=UPSTREAMS, providers=PROVIDERS, models=MODELS
    ) as running:
        yield running


@pytest.fixture(autouse=True)
def fresh(stack: Stack) -> Iterator[None]:
    stack.reset_upstreams()
    yield
    stack.wait_idle()


def turn(model: str, conversation: int, n: int, keyed: bool) -> dict[str, Any]:
    messages: list[dict[str, str]] = [
        {"role": "system", "content": f"You help with project {conversation}."},
    ]
    for i in range(n + 1):
        messages.append({"role": "user", "content": f"question {i} of conversation {conversation}"})
        if i < n:
            messages.append({"role": "assistant", "content": f"answer {i}"})
    body: dict[str, Any] = {"model": model, "messages": messages}
    if keyed:
        body["prompt_cache_key"] = f"conv-{conversation}"
    return body


def served_by(stack: Stack) -> dict[int, list[str]]:
    """conversation -> the upstream of each of its turns, in order (from the upstreams' logs)."""
    out: dict[int, list[tuple[str, int]]] = {}
    for name in UPSTREAMS:
        for request in stack.upstream(name).server.requests:
            system = request.json["messages"][0]["content"]
            conversation = int(system.split()[-1].rstrip("."))
            out.setdefault(conversation, []).append((name, len(request.json["messages"])))
    return {c: [name for name, _ in sorted(turns, key=lambda t: t[1])] for c, turns in out.items()}


def run_turns(stack: Stack, model: str, keyed: bool) -> None:
    with httpx.Client(base_url=stack.openai_url, timeout=30) as http:
        for n in range(TURNS):
            for conversation in range(CONVERSATIONS):
                answer = http.post(
                    "/v1/chat/completions",
                    json=turn(model, conversation, n, keyed),
                    headers={"authorization": f"Bearer {stack.token}"},
                )
                assert answer.status_code == 200, answer.text


@pytest.mark.parametrize(("model", "keyed"), [("sticky", True), ("sticky-prefix", False)])
def test_every_turn_of_a_conversation_returns_to_its_first_provider(
    stack: Stack, model: str, keyed: bool
) -> None:
    """One request at a time: the first provider always has a free slot, so every turn of
    each conversation runs there; the conversations themselves still spread."""
    hits_before = metric(stack, "iop_affinity_hits_total", model_group=model)
    run_turns(stack, model, keyed)
    served = served_by(stack)
    assert len(served) == CONVERSATIONS
    assert all(len(set(turns)) == 1 for turns in served.values()), served
    assert len({turns[0] for turns in served.values()}) == 3  # first turns spread over all
    hits = metric(stack, "iop_affinity_hits_total", model_group=model) - hits_before
    assert hits == CONVERSATIONS * (TURNS - 1)


def test_without_affinity_the_turns_of_a_conversation_spread(stack: Stack) -> None:
    run_turns(stack, "spread", keyed=True)
    served = served_by(stack)
    assert sum(len(set(turns)) > 1 for turns in served.values()) >= CONVERSATIONS // 2


def test_affinity_never_takes_a_provider_past_its_capacity(stack: Stack) -> None:
    """Twelve conversations at once, all keyed to be sticky, over 3 providers of capacity 2:
    no upstream ever runs more than 2 at once, and every request is served."""
    for name in UPSTREAMS:
        stack.upstream(name).server.faults.stall_before_first_byte = 0.2
    failures: list[str] = []

    def conversation(c: int) -> None:
        with httpx.Client(base_url=stack.openai_url, timeout=60) as http:
            for n in range(TURNS):
                answer = http.post(
                    "/v1/chat/completions",
                    json=turn("sticky", 100 + c % 2, n, keyed=True),  # two hot keys
                    headers={"authorization": f"Bearer {stack.token}"},
                )
                if answer.status_code != 200:
                    failures.append(answer.text)

    threads = [threading.Thread(target=conversation, args=(c,)) for c in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    assert all(stack.upstream(name).server.peak <= 2 for name in UPSTREAMS)
    assert metric(stack, "iop_affinity_misses_total", model_group="sticky") > 0
