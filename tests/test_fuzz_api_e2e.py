"""Generated bodies at the three POST endpoints of a real Edge (hypothesis): never a 500,
every refusal in the documented error shape of its API, and the pool back to zero leases
afterwards (R-IN-3, R-POOL-9).

A failing example is shown with the Edge's log lines written while it ran (the traceback of
an internal error). ``IOP_FUZZ_EXAMPLES`` sets the number of examples per endpoint (default
150) for a longer soak."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pool.http.errors import ERRORS
from pool.http.operations import MAX_NESTING, TOO_DEEP
from tests.support import Stack, messages_profile

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("IOP_FUZZ_EXAMPLES", "150"))
MODELS = ["gpt-test", "claude-test"]
# What a caller can get back at all (docs/http-api.md): success, the error table, and the
# upstream's own statuses passed through on the tunnel path.
STATUSES = {200} | {row.status for row in ERRORS.values()} - {500}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    providers = [
        {"id": "p-openai", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 4},
        {"id": "p-claude", "profile": "claude", "capacity": 4},
    ]
    models = [
        {"id": "gpt-test", "providers": {"p-openai": "served-gpt"}},
        {"id": "claude-test", "providers": {"p-claude": "served-claude"}},
    ]
    with Stack(
        tmp_path_factory.mktemp("fuzz"),
        providers=providers,
        models=models,
        profiles={"claude": messages_profile()},
        openai={"max_request_bytes": 256 * 1024},
        # Every generated body reaches dispatch: a fake upstream that fails on odd input
        # (HTTP 500, a 502 here) must not eject its provider for the rest of the run.
        pool={"eject_after_failures": 0},
        log_level="WARNING",
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[httpx.Client]:
    headers = {"authorization": f"Bearer {stack.token}", "x-api-key": stack.token}
    with httpx.Client(base_url=stack.openai_url, headers=headers, timeout=30) as http:
        yield http


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
)
# Keys the body scans and translators read (R-IN-7: a ``type`` holding an object was a 500).
KEYS = st.sampled_from(["type", "properties", "items", "enum", "source", "image_url", "text"])
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(KEYS | st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
content = st.one_of(
    st.text(max_size=60),
    st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "image_url", "image", "input_text", "bogus"])},
            optional={"text": json_values, "image_url": json_values, "source": json_values},
        ),
        max_size=3,
    ),
    json_values,
)
message = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "assistant", "system", "tool", ""]) | json_values,
        "content": content,
        "name": json_values,
    },
)
plausible = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(MODELS) | json_values,
        "messages": st.lists(message, max_size=3) | json_values,
        "input": st.text(max_size=40) | st.lists(message, max_size=2) | json_values,
        "stream": st.booleans() | json_values,
        "max_tokens": st.integers(min_value=-5, max_value=2**65) | json_values,
        "tools": st.lists(json_values, max_size=2) | json_values,
        "stream_options": json_values,
        "temperature": json_values,
    },
)
nearly_valid = st.fixed_dictionaries(
    {
        "model": st.sampled_from(MODELS),
        "messages": st.lists(
            st.fixed_dictionaries({"role": st.just("user"), "content": content}),
            min_size=1,
            max_size=2,
        ),
        "max_tokens": st.integers(min_value=1, max_value=64),
    },
    optional={
        "stream": st.booleans() | json_values,
        "input": st.text(max_size=40) | json_values,
        "tools": st.lists(json_values, max_size=2),
        "system": json_values,
        "metadata": json_values,
    },
)
bodies = st.one_of(
    nearly_valid.map(lambda doc: json.dumps(doc).encode()),
    plausible.map(lambda doc: json.dumps(doc).encode()),
    json_values.map(lambda doc: json.dumps(doc).encode()),
    st.binary(max_size=200),
    st.integers(min_value=1, max_value=3000).map(
        lambda depth: b'{"model":"gpt-test","messages":' + b"[" * depth + b"]" * depth + b"}"
    ),
)


def check_answer(path: str, answer: httpx.Response) -> None:
    assert answer.status_code in STATUSES, (answer.status_code, answer.text[:300])
    if answer.status_code == 200:
        return
    doc = answer.json()
    if path == "/v1/messages":
        assert doc["type"] == "error" and isinstance(doc["error"]["message"], str), doc
        assert isinstance(doc["error"]["type"], str)
    else:
        error = doc["error"]
        assert set(error) == {"message", "type", "param", "code"}, doc
        assert error["code"] in ERRORS or answer.status_code >= 500, doc


def log_sizes(stack: Stack) -> dict[Path, int]:
    """How far the Edge's and the Nodes' logs are written now."""
    logs = [proc.log for proc in [stack.edge, *stack.nodes] if proc is not None]
    return {log: log.stat().st_size for log in logs if log.exists()}


def diagnosis(path: str, body: bytes, answer: httpx.Response, logged: dict[Path, int]) -> str:
    """The failing example whole, the answer, and what the Edge and the Node logged while it
    ran (an internal error's traceback)."""
    lines = [
        f"POST {path} with body ({len(body)} bytes) {body!r}",
        f"answered {answer.status_code}: {answer.text[:2000]}",
    ]
    for log, size in logged.items():
        with log.open("rb") as file:
            file.seek(size)
            written = file.read().decode(errors="replace")
        lines.append(f"--- {log.name} meanwhile ---\n{written[-20000:] or '(nothing)'}")
    return "\n".join(lines)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
def test_r_in_3_generated_bodies_never_get_a_500_and_every_refusal_has_the_api_shape(
    stack: Stack, client: httpx.Client, path: str
) -> None:
    """R-IN-3: wrong types, odd nesting, bytes that are not JSON; then R-POOL-9: no lease
    is left behind by any of them."""
    seen: dict[int, int] = {}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(body=bodies)
    def one(body: bytes) -> None:
        logged = log_sizes(stack)
        answer = client.post(path, content=body, headers={"content-type": "application/json"})
        seen[answer.status_code] = seen.get(answer.status_code, 0) + 1
        try:
            check_answer(path, answer)
        except AssertionError as failed:
            raise AssertionError(diagnosis(path, body, answer, logged)) from failed

    one()
    assert set(seen) & {400}, seen  # the generator does reach the checks
    stack.wait_idle()
    assert "Traceback" not in stack.logs()


NESTED = {  # path -> a body whose one list field holds ``depth`` arrays
    "/v1/chat/completions": b'{"model":"gpt-test","messages":%s}',
    "/v1/responses": b'{"model":"gpt-test","input":%s}',
    "/v1/messages": b'{"model":"claude-test","max_tokens":5,"messages":%s}',
}


@pytest.mark.parametrize("path", sorted(NESTED))
def test_r_in_3_a_body_the_parser_follows_but_too_deep_to_encode_again_is_a_400_not_a_500(
    stack: Stack, client: httpx.Client, path: str
) -> None:
    """R-IN-3: under daphne ``messages`` nested 978 or 979 deep decoded but could not be
    encoded again for the Node (RecursionError, a 500). Every depth from the limit to past
    the interpreter's recursion limit is now a 400 naming the limit; the limit itself runs."""
    depths = [MAX_NESTING - 1, *range(MAX_NESTING, MAX_NESTING + 2), *range(900, 1011)]
    answers: dict[int, tuple[int, str]] = {}
    for depth in depths:
        logged = log_sizes(stack)
        body = NESTED[path] % (b"[" * depth + b"]" * depth)
        answer = client.post(path, content=body, headers={"content-type": "application/json"})
        answers[depth] = (answer.status_code, answer.text)
        if answer.status_code == 500:
            raise AssertionError(diagnosis(path, body, answer, logged))
    assert [d for d, (status, _) in answers.items() if status == 200] == [MAX_NESTING - 1]
    assert all(TOO_DEEP in text for d, (_, text) in answers.items() if d >= MAX_NESTING), answers
    stack.wait_idle()
