"""Provider health through a real Edge (daphne), a real ``iop-node`` and loopback upstreams:
failover before the first byte on every kind of upstream fault, ejection and recovery seen
in ``/pool``, ``/metrics`` and the log, and active probes (R-HEALTH-1..4). Every test ends
with the pool idle (R-POOL-9)."""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.fakes import CLI_TOOL
from tests.support.stack import Stack, provider_row

pytestmark = pytest.mark.slow

FAST_MS = 1000  # first-byte timeout of the failing provider
MODEL = "gpt-test"
REPLY = "Hello from the fake upstream, streaming word by word."


def chat_paths(stack: Stack, name: str) -> list[str]:
    return [r.path for r in stack.upstream(name).server.requests if r.path.endswith("/completions")]


def ask(oai: openai.OpenAI, stream: bool, model: str = MODEL) -> str:
    """One chat request through the SDK; the whole answer text."""
    messages: Any = [{"role": "user", "content": "hi"}]
    if not stream:
        reply = oai.chat.completions.create(model=model, messages=messages)
        return reply.choices[0].message.content or ""
    parts = []
    for chunk in oai.chat.completions.create(model=model, messages=messages, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


# --- failover on every kind of failure before the first byte ---------------------------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    bad = {"capacity": 2, "priority": 10, "first_byte_timeout_ms": FAST_MS}
    with Stack(
        tmp_path_factory.mktemp("failover"),
        upstreams={"bad": "openai", "good": "openai"},
        providers=[
            {"id": "p-bad", "profile": "openai", "base_url": "{up:bad}/v1", **bad},
            {"id": "p-good", "profile": "openai", "base_url": "{up:good}/v1", "priority": 20},
        ],
        models=[{"id": MODEL, "providers": {"p-bad": "served", "p-good": "served"}}],
        # Never eject here: every request meets the fault first, whatever ran before.
        pool={"retry_before_first_byte": 1, "eject_after_failures": 0},
    ) as running:
        yield running


FAULTS: dict[str, dict[str, Any]] = {
    "refused": {},  # the upstream is down
    "reset-mid-headers": {"reset_before_headers": True},
    "http-500": {"status": 500},
    "http-502": {"status": 502},
    "http-503": {"status": 503},
    "http-429": {"status": 429},
    "http-429-retry-after": {"status": 429, "retry_after": "30"},
    "stall-before-first-byte": {"stall_before_first_byte": math.inf},
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_failure_before_the_first_byte_is_answered_once_by_the_other_provider_r_health_1(
    stack: Stack, oai: openai.OpenAI, fault: str, stream: bool
) -> None:
    """R-HEALTH-1: one answer, all of it, from p-good; p-good saw the request exactly once."""
    stack.reset_upstreams()
    bad = stack.upstream("bad")
    if fault == "refused":
        bad.go_down()
    for key, value in FAULTS[fault].items():
        setattr(bad.server.faults, key, value)
    try:
        assert ask(oai, stream) == REPLY  # no duplicated or partial output
    finally:
        if fault == "refused":
            bad.come_back()
    assert len(chat_paths(stack, "good")) == 1
    assert len(chat_paths(stack, "bad")) == (0 if fault == "refused" else 1)
    stack.wait_idle()


def test_a_failure_after_the_first_byte_is_not_retried_and_ends_in_band_r_health_1(
    stack: Stack, http: httpx.Client
) -> None:
    stack.reset_upstreams()
    stack.upstream("bad").server.faults.drop_mid_stream = True
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200
    events = [line for line in resp.text.split("\n\n") if line.startswith("data: ")]
    assert len(events) == 2  # the one chunk sent before the drop, then the error event
    assert json.loads(events[-1][6:])["error"]["code"] == "upstream_error"
    assert chat_paths(stack, "good") == []
    stack.wait_idle()


# --- ejection, recovery and probes -------------------------------------------------------------


# The cli provider's probe fails while this file exists: absent from the start, so p-cli is
# healthy until the R-HEALTH-3 test makes it fail (its probes run through the whole module).
FAILING_FLAG = "cli-failing.flag"


@pytest.fixture(scope="module")
def health_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("health")
    flag = str(directory / FAILING_FLAG)
    probe = f"import os, sys; sys.exit(1 if os.path.exists({flag!r}) else 0)"
    with Stack(
        directory,
        upstreams={"flaky": "openai", "good": "openai", "probed": "openai"},
        providers=[
            {"id": "p-flaky", "profile": "openai", "base_url": "{up:flaky}/v1", "priority": 10},
            {"id": "p-good", "profile": "openai", "base_url": "{up:good}/v1", "priority": 20},
            {
                "id": "p-probed",
                "profile": "openai",
                "base_url": "{up:probed}/v1",
                "probe_interval_s": 1,
            },
            {
                "id": "p-cli",
                "type": "cli",
                "command": [sys.executable, CLI_TOOL, "echo"],
                "probe_command": [sys.executable, "-c", probe],
                "probe_interval_s": 1,
            },
        ],
        models=[
            {"id": MODEL, "providers": {"p-flaky": "served", "p-good": "served"}},
            {"id": "solo", "providers": {"p-flaky": "served"}},
            {"id": "probed", "providers": {"p-probed": "served"}},
            {"id": "cli", "providers": {"p-cli": "echo"}},
        ],
        pool={"eject_after_failures": 2, "eject_base_s": 3, "eject_max_s": 6},
    ) as running:
        yield running


@pytest.fixture
def health_oai(health_stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=health_stack.v1_url, api_key=health_stack.token, max_retries=0, timeout=20
    ) as client:
        yield client


def test_a_dead_provider_costs_callers_nothing_and_is_ejected_then_restored_r_health_2(
    health_stack: Stack, health_oai: openai.OpenAI
) -> None:
    """R-HEALTH-1, R-HEALTH-2, R-HEALTH-4: every request succeeds; the live upstream sees each
    exactly once; the dead one is ejected, visible everywhere, and back after one trial."""
    stack = health_stack
    flaky = stack.upstream("flaky")
    flaky.go_down()
    try:
        answers = [ask(health_oai, stream=i % 2 == 1) for i in range(6)]
        assert answers == [REPLY] * 6
        assert len(chat_paths(stack, "good")) == 6
        ejected = provider_row(stack.pool_snapshot(), "p-flaky")
        assert ejected["health"] == "ejected"
        assert ejected["health_reason"] == "cannot connect to the upstream (2 failures in a row)"
        assert 0 < ejected["ejected_for_s"] <= 3
        # A group with nothing left answers at once, naming why (never the address).
        with pytest.raises(openai.APIStatusError) as refused:
            ask(health_oai, stream=False, model="solo")
        assert refused.value.status_code == 503
        assert refused.value.code == "no_available_provider"
        message = refused.value.message
        assert "cannot connect to the upstream" in message
        assert flaky.url.split("//")[1] not in message
        text = stack.metrics_text()
        assert 'iop_provider_health{node="node-1",provider="p-flaky",state="ejected"} 1.0' in text
        assert 'iop_provider_ejections_total{provider="p-flaky"} 1.0' in text
        left = re.search(
            r'iop_provider_ejected_seconds\{node="node-1",provider="p-flaky"\} (\S+)', text
        )
        assert left is not None and 0 < float(left.group(1)) <= 3
        assert f'iop_retries_total{{model="{MODEL}",provider="p-flaky"}} 2.0' in text
    finally:
        flaky.come_back()
    stack.wait_until(
        lambda s: provider_row(s, "p-flaky")["health"] == "probing", 10, "the trial window"
    )
    assert ask(health_oai, stream=True) == REPLY  # the trial goes to p-flaky (preferred)
    assert len(chat_paths(stack, "flaky")) == 1
    # The trial's verdict is recorded as its request ends, which may be just after the
    # caller read the last byte.
    stack.wait_until(lambda s: provider_row(s, "p-flaky")["health"] == "healthy", 10, "restored")
    changes = re.findall(r"provider p-flaky \(node node-1\): (\w+) -> (\w+)", stack.logs())
    assert changes == [("healthy", "ejected"), ("ejected", "probing"), ("probing", "healthy")]
    stack.wait_idle()


def health_changes(stack: Stack, provider_id: str) -> list[tuple[str, str, str]]:
    """Every logged change of ``provider_id``'s health, in order: (before, after, detail)."""
    pattern = rf"provider {provider_id} \(node node-1\): (\w+) -> (\w+)(.*)"
    return [(m[0], m[1], m[2]) for m in re.findall(pattern, stack.logs())]


def test_failing_probes_eject_and_a_passing_one_restores_without_a_slot_r_health_3(
    health_stack: Stack,
) -> None:
    """R-HEALTH-3: the Node's probes alone move the providers (the HTTP one by its models
    operation, the cli one by its probe_command); no lease is ever taken.

    Each provider is watched on its own: their probes tick independently, so the first one
    ejected may already be on a failed trial (R-HEALTH-2) when the other is ejected."""
    stack = health_stack
    probed = stack.upstream("probed")
    reasons = {
        "p-probed": "probe failed: upstream answered HTTP 503 (2 failures in a row)",
        "p-cli": "probe failed: probe command exited with code 1 (2 failures in a row)",
    }
    assert all(stack.provider(pid)["health"] == "healthy" for pid in reasons)
    probed.server.faults.status = 503
    (stack.dir / FAILING_FLAG).touch()

    def first_in(state: str, first: dict[str, dict[str, Any]]) -> Any:
        """Each watched provider's row as first seen in ``state``; done when all were."""

        def done(snap: dict[str, Any]) -> bool:
            for pid in reasons:
                row = provider_row(snap, pid)
                assert row["in_flight"] == 0, row
                if row["health"] == state:
                    first.setdefault(pid, row)
            return len(first) == len(reasons)

        return done

    ejected: dict[str, dict[str, Any]] = {}
    stack.wait_until(first_in("ejected", ejected), 15, "ejected by probes")
    for pid, reason in reasons.items():
        # Seen at once (an ejection lasts 3 s, the poll 20 ms) and logged first: a later
        # ejection would be a failed trial with its own reason.
        assert ejected[pid]["health_reason"] == reason
        assert health_changes(stack, pid)[0] == ("healthy", "ejected", f" for 3 s: {reason}")
    assert {r.path for r in probed.server.requests} == {"/v1/models"}
    probed.reset()
    (stack.dir / FAILING_FLAG).unlink()
    stack.wait_until(first_in("healthy", {}), 15, "restored by probes")
    for pid in reasons:
        changes = health_changes(stack, pid)
        assert changes[-1][1:] == ("healthy", " (an active probe succeeded)"), changes
        # In between only the backoff cycle: probing, then a failed probe as the trial.
        assert {c[:2] for c in changes[1:-1]} <= {("ejected", "probing"), ("probing", "ejected")}
    assert chat_paths(stack, "probed") == []
    stack.wait_idle()
