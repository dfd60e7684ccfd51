"""Fallbacks between model groups through a real Edge, Node and fake upstreams, with the
official SDKs (R-FALL-1): a group whose providers are ejected and a prompt too long for a
group are served by the next group of the chain, stream and non-stream, with the caller's
``model`` in the answer and ``x-iop-model-group`` naming the group that served; the caller's
scope skips a fallback; an ejected fallback is skipped; the ledger and /metrics record both
groups; ``/v1/models`` is unchanged."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.support import Stack, provider_row, sha256_hex

pytestmark = pytest.mark.slow

FULL, SCOPED = "iop-fallback-full-" + "w" * 16, "iop-fallback-scoped-" + "z" * 16
PROVIDERS = [
    # on the "bad" upstream (always 500): ejected after their first failure
    {"id": "p-a", "profile": "openai", "base_url": "{up:bad}/v1", "capacity": 2},
    {"id": "p-c", "profile": "openai", "base_url": "{up:bad}/v1", "capacity": 2},
    {"id": "p-e", "profile": "openai", "base_url": "{up:bad}/v1", "capacity": 2},
    # healthy
    {"id": "p-b", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 2},
    {"id": "p-d", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 2},
    {"id": "p-f", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 2},
    {"id": "p-small", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 2,
     "context_window_tokens": 256},
    {"id": "p-claude", "profile": "anthropic", "base_url": "{up:claude}/v1", "capacity": 2,
     "context_window_tokens": 200000, "credential": {"env": "IOP_TEST_FALLBACK_KEY"}},
]  # fmt: skip
MODELS = [
    {"id": "a-main", "providers": {"p-a": "served-a"}, "fallbacks": ["a-backup"]},
    {"id": "a-backup", "providers": {"p-b": "served-b"}},
    {"id": "b-main", "providers": {"p-c": "served-c"},
     "fallbacks": ["b-hidden", "b-ejected", "b-last"]},
    {"id": "b-hidden", "providers": {"p-d": "served-d"}},
    {"id": "b-ejected", "providers": {"p-e": "served-e"}},
    {"id": "b-last", "providers": {"p-f": "served-f"}},
    # a long prompt: the small group cannot hold it, the Anthropic one can (by translation)
    {"id": "short", "providers": {"p-small": "served-small"}, "fallbacks": ["long"]},
    {"id": "long", "providers": {"p-claude": "claude-served"}, "translate": True},
]  # fmt: skip
LONG_PROMPT = "many words " * 400  # ~1100 estimated tokens: over p-small's 256


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tokens = [
        {
            "token_ref": "app-full",
            "principal_ref": "team-full",
            "token_hash_sha256": sha256_hex(FULL),
        },
        {
            "token_ref": "app-scoped",
            "principal_ref": "team-scoped",
            "token_hash_sha256": sha256_hex(SCOPED),
            "models": ["b-main", "b-ejected", "b-last"],
        },
    ]
    with Stack(
        tmp_path_factory.mktemp("fallbacks"),
        upstreams={"main": "openai", "bad": "openai", "claude": "anthropic"},
        providers=PROVIDERS,
        models=MODELS,
        pool={"eject_after_failures": 1, "eject_base_s": 600, "retry_before_first_byte": 0},
        openai={"principal_tokens": tokens},
        env={"IOP_TEST_FALLBACK_KEY": "sk-test-fallback"},
    ) as running:
        running.upstream("claude").server.api_key = "sk-test-fallback"
        running.upstream("bad").server.faults.status = 500
        yield running


def client(stack: Stack, token: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.v1_url, api_key=token or FULL, max_retries=0)


def eject(stack: Stack, group: str, provider: str, token: str | None = None) -> None:
    """One failing request ejects the group's provider (eject_after_failures: 1)."""
    with client(stack, token) as oai, pytest.raises(openai.APIStatusError):
        oai.chat.completions.create(model=group, messages=[{"role": "user", "content": "x"}])
    stack.wait_until(
        lambda snap: provider_row(snap, provider)["health"] == "ejected", what=f"{provider} ejected"
    )


def ask(stack: Stack, model: str, *, stream: bool, content: str = "hi", token: str | None = None
        ) -> tuple[str, str, str]:  # fmt: skip
    """(the answer's model, its x-iop-model-group header, its text) through the openai SDK."""
    with client(stack, token) as oai:
        create = oai.chat.completions.with_raw_response.create
        messages: Any = [{"role": "user", "content": content}]
        if not stream:
            raw = create(model=model, messages=messages)
            reply = raw.parse()
            return reply.model, raw.headers["x-iop-model-group"], reply.choices[0].message.content
        raw = create(model=model, messages=messages, stream=True)
        chunks = list(raw.parse())
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert {c.model for c in chunks} == {model}
        return chunks[0].model, raw.headers["x-iop-model-group"], text


def test_an_ejected_group_falls_back_to_the_next_r_fall_1(stack: Stack) -> None:
    """R-FALL-1: every provider of a-main ejected -> no_available_provider -> a-backup serves,
    stream and non-stream; the caller's model stays, the header names a-backup."""
    eject(stack, "a-main", "p-a")
    for stream in (False, True):
        model, group, text = ask(stack, "a-main", stream=stream)
        assert (model, group) == ("a-main", "a-backup") and text
    served = [r.json["model"] for r in stack.upstream("main").server.requests]
    assert served[-2:] == ["served-b", "served-b"]  # a-backup's own mapping


def test_a_prompt_too_long_for_the_group_falls_back_r_fall_1(stack: Stack) -> None:
    """R-FALL-1: context_length_exceeded on 'short' -> 'long', an Anthropic provider reached
    by translation (that group's mapping and translation apply), stream and non-stream; the
    anthropic SDK on /v1/messages too."""
    for stream in (False, True):
        model, group, text = ask(stack, "short", stream=stream, content=LONG_PROMPT)
        assert (model, group) == ("short", "long") and text
    claude = [r for r in stack.upstream("claude").server.requests if r.path == "/v1/messages"]
    assert claude and claude[-1].json["model"] == "claude-served"
    with anthropic.Anthropic(base_url=stack.openai_url, api_key=FULL, max_retries=0) as ant:
        raw = ant.messages.with_raw_response.create(
            model="short", max_tokens=16, messages=[{"role": "user", "content": LONG_PROMPT}]
        )
    assert raw.parse().model == "short" and raw.headers["x-iop-model-group"] == "long"
    # A prompt that fits stays on its own group.
    assert ask(stack, "short", stream=False)[1] == "short"


def test_scope_and_an_ejected_fallback_are_skipped_r_fall_1(stack: Stack) -> None:
    """R-FALL-1: b-hidden is outside the token's scope and b-ejected is ejected itself: the
    request of b-main is served by b-last."""
    eject(stack, "b-main", "p-c", SCOPED)
    eject(stack, "b-ejected", "p-e", SCOPED)
    before = {r.json["model"] for r in stack.upstream("main").server.requests}
    model, group, _ = ask(stack, "b-main", stream=False, token=SCOPED)
    assert (model, group) == ("b-main", "b-last")
    after = [r.json["model"] for r in stack.upstream("main").server.requests]
    assert "served-d" not in set(after) - before  # never sent to the out-of-scope group
    # The full token sees b-hidden first.
    assert ask(stack, "b-main", stream=False)[1] == "b-hidden"


def test_metering_records_the_asked_and_the_serving_group_r_fall_1(stack: Stack) -> None:
    """R-FALL-1: the ledger row names both groups; iop_fallbacks_total counts the move;
    /v1/models is unchanged (groups only, no fallback entries)."""
    ask(stack, "a-main", stream=False)
    counted = [
        s
        for s in stack.metrics()
        if s.name == "iop_fallbacks_total" and s.labels["model_group"] == "a-main"
    ]
    assert counted and counted[0].labels["served_by"] == "a-backup" and counted[0].value >= 1
    deadline = time.monotonic() + 15
    while True:
        rows = [r for r in stack.ledger() if r["requested_group"] == "a-main"]
        if rows or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert rows and {r["model_group"] for r in rows} == {"a-backup"}
    assert {r["attributed_to"] for r in rows} == {"p-b"}
    with client(stack) as oai:
        listed = sorted(m.id for m in oai.models.list())
    assert listed == sorted(m["id"] for m in MODELS)
