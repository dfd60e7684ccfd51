"""Per-token policy through a real Edge, a real Node and the official SDKs (R-PRIN-1..3).

Scoping on every operation, each limit with its headers, the SDK's own retry after a
``rate_limited`` answer, the queue share of a flooding token, and live changes.
"""

from __future__ import annotations

import copy
import http.client
import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from tests.support import Stack, messages_profile, sha256_hex
from tests.support.upstream_loop import Hold

pytestmark = pytest.mark.slow

WINDOW_S = 2  # IOP_RATE_LIMIT_WINDOW_S: rpm / tpm count per 2 s here, so resets come fast
MESSAGES = [{"role": "user", "content": "hello"}]
POLICIES: dict[str, dict[str, Any]] = {
    "scoped": {"models": ["gpt-test"]},
    "wide": {},
    "flood": {"max_queued": 2},
    "inflight": {"max_in_flight": 1},
    "lowered": {"max_in_flight": 3},
    "rpm": {"rpm": 2},
    "tpm": {"tpm": 60},
    "retry": {"rpm": 1},
    "revoked": {},
    "share-a": {},
    "share-b": {"max_queued": 4},  # the principal's share is the one counted (R-MGD-13)
}
SHARED = "team-share"  # the principal of share-a and share-b, with max_queued: 1
TOKENS = {name: f"iop-{name}-token-{'x' * 16}" for name in POLICIES}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    providers = [
        {"id": "p-main", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 1},
        {"id": "p-other", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 4},
        {"id": "p-anthropic", "profile": "messages_api", "capacity": 4},
    ]
    models = [
        {"id": "gpt-test", "providers": {"p-main": "served-gpt"}},
        {"id": "other-model", "providers": {"p-other": "served-other"}},
        {"id": "claude-test", "providers": {"p-anthropic": "served-claude"}},
    ]
    tokens = [
        {
            "token_ref": f"app-{name}",
            "principal_ref": SHARED if name.startswith("share-") else f"team-{name}",
            "token_hash_sha256": sha256_hex(TOKENS[name]),
            **policy,
        }
        for name, policy in POLICIES.items()
    ]
    with Stack(
        tmp_path_factory.mktemp("principals"),
        providers=providers,
        models=models,
        profiles={"messages_api": messages_profile()},
        openai={"principal_tokens": tokens},
        principals=[{"id": SHARED, "max_queued": 1}],
        env={"IOP_RATE_LIMIT_WINDOW_S": str(WINDOW_S)},
    ) as running:
        yield running


@pytest.fixture(autouse=True)
def idle_after(stack: Stack) -> Iterator[None]:
    with stack.clean_slate():
        yield


def client(stack: Stack, name: str, **kwargs: Any) -> openai.OpenAI:
    options: dict[str, Any] = {"max_retries": 0, "timeout": 20, **kwargs}
    return openai.OpenAI(base_url=stack.v1_url, api_key=TOKENS[name], **options)


def chat(stack: Stack, name: str, model: str = "gpt-test", content: str = "hello") -> Any:
    """A non-stream chat with the raw response (headers) kept."""
    with client(stack, name) as oai:
        return oai.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": content}]
        )


def open_stream(stack: Stack, name: str, model: str = "gpt-test") -> http.client.HTTPConnection:
    """A streamed chat, sent and not read: the caller finishes or drops it."""
    return stack.send_chat(model, stream=True, token=TOKENS[name])


def finish(conn: http.client.HTTPConnection) -> tuple[int, bytes]:
    try:
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def refused(call: Callable[[], Any], attempts: int = 8) -> openai.RateLimitError:
    """Call until the Edge answers 429 (bounded): windows may roll over between calls."""
    for _ in range(attempts):
        try:
            call()
        except openai.RateLimitError as err:
            return err
    raise AssertionError(f"no 429 in {attempts} calls")


# --- R-PRIN-1: scoping ----------------------------------------------------------------------


def test_models_lists_only_the_groups_of_a_scoped_token(stack: Stack) -> None:
    """R-PRIN-1: /v1/models shows a scoped token its groups only; others see all."""
    with client(stack, "scoped") as oai:
        assert [m.id for m in oai.models.list()] == ["gpt-test"]
        assert oai.models.retrieve("gpt-test").id == "gpt-test"
    with client(stack, "wide") as oai:
        assert sorted(m.id for m in oai.models.list()) == [
            "claude-test",
            "gpt-test",
            "other-model",
        ]


def test_a_group_outside_the_scope_is_404_model_not_found_on_every_operation(
    stack: Stack,
) -> None:
    """R-PRIN-1: 404 ``model_not_found`` (never 403), alike for a group that does not exist."""
    with client(stack, "scoped") as oai:
        calls: list[Callable[[], Any]] = [
            lambda: oai.chat.completions.create(model="other-model", messages=MESSAGES),
            lambda: oai.chat.completions.create(
                model="other-model", messages=MESSAGES, stream=True
            ),
            lambda: oai.responses.create(model="other-model", input="hello"),
            lambda: oai.models.retrieve("other-model"),
        ]
        for call in calls:
            with pytest.raises(openai.NotFoundError) as caught:
                call()
            assert caught.value.code == "model_not_found"
        assert oai.chat.completions.create(model="gpt-test", messages=MESSAGES).choices
    with anthropic.Anthropic(
        base_url=stack.openai_url, api_key=TOKENS["scoped"], max_retries=0, timeout=20
    ) as ant:
        with pytest.raises(anthropic.NotFoundError) as messages:
            ant.messages.create(model="claude-test", max_tokens=16, messages=MESSAGES)
        with pytest.raises(anthropic.NotFoundError) as counted:
            ant.messages.count_tokens(model="claude-test", messages=MESSAGES)
    assert messages.value.body == counted.value.body
    # The answer is the one an unknown group gets: the token learns nothing about others.
    with client(stack, "wide") as oai, pytest.raises(openai.NotFoundError) as unknown:
        oai.chat.completions.create(model="no-such-model", messages=MESSAGES)
    with client(stack, "scoped") as oai, pytest.raises(openai.NotFoundError) as hidden:
        oai.chat.completions.create(model="other-model", messages=MESSAGES)
    # Only the echoed model name differs (the message names it, docs/http-api.md).
    named = json.dumps(unknown.value.body).replace("no-such-model", "other-model")
    assert hidden.value.body == json.loads(named)
    assert not [r for r in stack.upstream().server.requests if r.json["model"] != "served-gpt"]


# --- R-PRIN-2: limits and headers -------------------------------------------------------------


def test_over_max_in_flight_is_429_rate_limited_with_retry_after(stack: Stack) -> None:
    """R-PRIN-2: the second concurrent request of a max_in_flight=1 token is refused."""
    hold = Hold(stack.upstream())
    running = open_stream(stack, "inflight", "other-model")
    try:
        hold.wait_streaming()
        with client(stack, "inflight") as oai, pytest.raises(openai.RateLimitError) as caught:
            oai.chat.completions.create(model="other-model", messages=MESSAGES)
        assert caught.value.code == "rate_limited"
        assert caught.value.response.headers["retry-after"] == "1"
        chat(stack, "wide", "other-model")  # another token is not limited by it
    finally:
        hold.release()
        status, _ = finish(running)
    assert status == 200
    assert chat(stack, "inflight", "other-model").http_response.status_code == 200


def test_rpm_headers_come_on_success_and_over_the_limit_it_is_429(stack: Stack) -> None:
    """R-PRIN-2: x-ratelimit-*-requests on every answer; over rpm a 429 with Retry-After."""
    ok = chat(stack, "rpm")
    headers = ok.http_response.headers
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "1"
    assert headers["x-ratelimit-reset-requests"].endswith("s")
    assert "x-ratelimit-limit-tokens" not in headers
    err = refused(lambda: chat(stack, "rpm"))
    assert err.code == "rate_limited"
    headers = err.response.headers
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert 1 <= int(headers["retry-after"]) <= WINDOW_S
    assert 0 < int(headers["retry-after-ms"]) <= WINDOW_S * 1000
    assert float(headers["x-ratelimit-reset-requests"].rstrip("s")) <= WINDOW_S


def test_over_tpm_is_429_with_the_token_headers(stack: Stack) -> None:
    """R-PRIN-2: tokens per window count the input estimate; the answer names the tokens."""
    ok = chat(stack, "tpm", content="hi")
    assert ok.http_response.headers["x-ratelimit-limit-tokens"] == "60"
    big = "x" * 160  # about 40 more tokens of estimate than the short request
    err = refused(lambda: chat(stack, "tpm", content=big))
    assert err.code == "rate_limited"
    headers = err.response.headers
    assert headers["x-ratelimit-limit-tokens"] == "60"
    assert int(headers["x-ratelimit-remaining-tokens"]) < 60
    assert "x-ratelimit-limit-requests" not in headers


def test_the_openai_sdk_retry_honours_retry_after_and_succeeds_after_the_reset(
    stack: Stack,
) -> None:
    """R-PRIN-2: with max_retries=1 the SDK waits as told and its second attempt succeeds.

    Without the headers the SDK would back off about 0.5-1 s, within the 2 s window, and be
    refused again; the window can roll over between setup calls, so the scenario is retried.
    """
    statuses: list[int] = []
    hooks = {"response": [lambda response: statuses.append(response.status_code)]}
    for _ in range(4):
        refused(lambda: chat(stack, "retry"))
        statuses.clear()
        with (
            httpx.Client(event_hooks=hooks) as http_client,
            client(stack, "retry", max_retries=1, http_client=http_client) as oai,
        ):
            reply = oai.chat.completions.create(model="gpt-test", messages=MESSAGES)
        assert reply.choices[0].message.content
        if statuses == [429, 200]:
            return
        assert statuses == [200]  # the window rolled over before the SDK's first attempt
    raise AssertionError("the SDK never saw the 429 first")


# --- R-PRIN-3: queue share --------------------------------------------------------------------


def test_a_flooding_token_gets_queue_full_while_another_token_still_queues(
    stack: Stack,
) -> None:
    """R-PRIN-3: max_queued=2 caps one token's waiters; the queue stays open to others."""
    hold = Hold(stack.upstream())
    running = open_stream(stack, "flood")  # takes p-main's one slot and is held there
    hold.wait_streaming()
    queued = [open_stream(stack, "flood") for _ in range(2)]
    stack.wait_until(lambda s: s["queue_depth"] == 2, what="two queued flood requests")
    with client(stack, "flood") as oai, pytest.raises(openai.RateLimitError) as caught:
        oai.chat.completions.create(model="gpt-test", messages=MESSAGES)
    assert caught.value.code == "queue_full"
    other = open_stream(stack, "wide")
    stack.wait_until(lambda s: s["queue_depth"] == 3, what="the other token queued")
    hold.release()
    assert [finish(conn)[0] for conn in (running, *queued, other)] == [200, 200, 200, 200]


def test_a_principal_s_queue_share_counts_all_its_tokens_r_mgd_13(stack: Stack) -> None:
    """R-MGD-13: ``max_queued: 1`` on the principal of two tokens: one waiter of one token
    fills it, so the other token's request gets 429 queue_full (its own ``max_queued: 4``
    does not widen the principal's), while another principal still queues."""
    hold = Hold(stack.upstream())
    running = open_stream(stack, "wide")  # takes p-main's one slot and is held there
    hold.wait_streaming()
    queued = open_stream(stack, "share-a")
    stack.wait_until(lambda s: s["queue_depth"] == 1, what="the principal's one waiter")
    with client(stack, "share-b") as oai, pytest.raises(openai.RateLimitError) as caught:
        oai.chat.completions.create(model="gpt-test", messages=MESSAGES)
    assert caught.value.code == "queue_full"
    other = open_stream(stack, "wide")
    stack.wait_until(lambda s: s["queue_depth"] == 2, what="another principal queued")
    hold.release()
    assert [finish(conn)[0] for conn in (running, queued, other)] == [200, 200, 200]


# --- live changes -----------------------------------------------------------------------------


def edited(stack: Stack, name: str, **policy: Any) -> dict[str, Any]:
    document = copy.deepcopy(yaml.safe_load(stack.config_path.read_text()))
    for token in document["openai"]["principal_tokens"]:
        if token["token_ref"] == f"app-{name}":
            token.update(policy)
    return document


def test_lowering_a_limit_live_never_cancels_running_requests(stack: Stack) -> None:
    """R-PRIN-2: limits are live; running requests above the new limit finish normally."""
    hold = Hold(stack.upstream())
    running = [open_stream(stack, "lowered", "other-model") for _ in range(2)]
    stack.wait_until(lambda s: sum(p["in_flight"] for p in s["providers"]) == 2, what="two running")
    status, report = stack.refresh("apply", edited(stack, "lowered", max_in_flight=1))
    try:
        assert status == 200, report
        assert report["live_paths"] == ['openai.principal_tokens["app-lowered"].max_in_flight']
        with client(stack, "lowered") as oai, pytest.raises(openai.RateLimitError):
            oai.chat.completions.create(model="other-model", messages=MESSAGES)
    finally:
        hold.release()
        results = [finish(conn) for conn in running]
        stack.refresh("apply", yaml.safe_load(stack.config_path.read_text()))
    assert [code for code, _ in results] == [200, 200]
    assert all(body.rstrip().endswith(b"data: [DONE]") for _, body in results)


def test_a_principal_token_removed_live_is_refused_at_once(stack: Stack) -> None:
    """R-REF-2: removing a token is a live change; its running request still finishes."""
    assert chat(stack, "revoked").http_response.status_code == 200
    hold = Hold(stack.upstream())
    running = open_stream(stack, "revoked", "other-model")
    hold.wait_streaming()
    document = yaml.safe_load(stack.config_path.read_text())
    tokens = document["openai"]["principal_tokens"]
    document["openai"]["principal_tokens"] = [t for t in tokens if t["token_ref"] != "app-revoked"]
    status, report = stack.refresh("apply", document)
    try:
        assert status == 200, report
        assert report["live_paths"] == ['openai.principal_tokens["app-revoked"]']
        with pytest.raises(openai.AuthenticationError):
            chat(stack, "revoked")
    finally:
        hold.release()
        code, _ = finish(running)
    assert code == 200
