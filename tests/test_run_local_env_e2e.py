"""`make run` under the environment variables the docs say it passes on to its Edge and
Node (docs/observability.md, docs/configuration.md: ``LOG_FORMAT``, ``LOG_LEVEL``,
``IOP_ACCESS_LOG``, ``OTEL_*``), each run as written in a copy of the checkout
(tests.support.quickstart): it prints the client token, a request is answered 200, and a
TERM to `make run`'s script stops the Edge and the Node with it.

One start per combination, each value of each variable in at least one of them: the two
below, plus plain ``make run`` (tests/test_readme_e2e.py: human, INFO, no access log, no
tracing) and ``OTEL_EXPORTER_OTLP_ENDPOINT=... make run`` (tests/test_observability_doc_e2e.py:
human, traced).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.journeys import wait_for
from tests.support.otlp import FAST_EXPORT, OtlpReceiver
from tests.support.pids import alive, descendants
from tests.support.quickstart import Quickstart, make_run

pytestmark = pytest.mark.slow

VERBOSE = (
    "LOG_FORMAT=json LOG_LEVEL=DEBUG IOP_ACCESS_LOG=1 OTEL_EXPORTER_OTLP_ENDPOINT={otlp} make run"
)
QUIET = (
    "LOG_FORMAT=human LOG_LEVEL=warning IOP_ACCESS_LOG=0 OTEL_SDK_DISABLED=true "
    "OTEL_EXPORTER_OTLP_ENDPOINT={otlp} make run"
)


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    running = OtlpReceiver()
    yield running
    running.stop()


def answered(quickstart: Quickstart) -> httpx.Response:
    """The README's request (docs: the `echo` model) once the local Node is online."""
    wait_for(lambda: quickstart.provider_online("echo-cli"), 60, "the local Node online",
             log=quickstart.log)  # fmt: skip
    return httpx.post(
        f"http://127.0.0.1:{quickstart.ports['openai']}/v1/chat/completions",
        headers={"authorization": f"Bearer {quickstart.token}"},
        json={"model": "echo", "messages": [{"role": "user", "content": "hello"}]},
        timeout=30,
    )


def json_lines(quickstart: Quickstart) -> list[dict[str, Any]]:
    return [json.loads(line) for line in quickstart.output if line.startswith("{")]


def terminated_alone(quickstart: Quickstart) -> None:
    """TERM to the run_local.py process only (not its group): its Edge and Node end too."""
    below = descendants(quickstart.pid)
    (script,) = [pid for pid, argv in below if argv.endswith("scripts/run_local.py")]
    children = [pid for pid, argv in below if "runedge" in argv or "nodes.agent.main" in argv]
    assert len(children) == 2, below
    os.kill(script, signal.SIGTERM)
    wait_for(lambda: not any(alive(pid) for pid in [script, *children]), 30,
             "the script, its Edge and its Node ended", log=quickstart.log)  # fmt: skip


def test_json_debug_access_log_and_tracing(tmp_path: Path, receiver: OtlpReceiver) -> None:
    """JSON lines from both sides (the Edge's ready line too), the Edge's and the Node's
    DEBUG decisions, one access line, spans of both services; the token in no log line."""
    command = VERBOSE.format(otlp=receiver.endpoint)
    with make_run(tmp_path, command, env=FAST_EXPORT) as quickstart:
        reply = answered(quickstart)
        assert reply.status_code == 200 and reply.json()["object"] == "chat.completion"
        receiver.wait_for(lambda got: {"iop-edge", "iop-node"} <= {s.service for s in got},
                          what="spans of the Edge and the Node")  # fmt: skip
        wait_for(lambda: any(line["logger"] == "iop.access" for line in json_lines(quickstart)),
                 30, "the access line", log=quickstart.log)  # fmt: skip
        terminated_alone(quickstart)
        lines = json_lines(quickstart)
    messages = [(line["logger"], line["level"], line["message"]) for line in lines]
    assert any(m.startswith("IOP Edge ready") for _, _, m in messages), quickstart.log()
    assert ("iop.pool", "DEBUG") in {(lg, lv) for lg, lv, m in messages if "echo-cli" in m}
    assert any(lg.startswith("iop_node") and lv == "DEBUG" and "echo-cli" in m
               for lg, lv, m in messages), quickstart.log()  # fmt: skip
    (access,) = [m for lg, _, m in messages if lg == "iop.access"]
    assert " 200 ok " in access
    for line in quickstart.output:  # Edge and Node lines are JSON; the script's are its own
        if quickstart.token in line:
            assert line.startswith(("Client token", "    -H 'Authorization: Bearer")), line
    assert not [line for line in lines if quickstart.token in json.dumps(line)]


def test_human_warning_no_access_log_tracing_disabled(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    """Plain lines, nothing below WARNING from either side, no access line, no span sent
    though an endpoint is named (``OTEL_SDK_DISABLED`` wins)."""
    command = QUIET.format(otlp=receiver.endpoint)
    with make_run(tmp_path, command, env=FAST_EXPORT) as quickstart:
        reply = answered(quickstart)
        assert reply.status_code == 200 and reply.json()["object"] == "chat.completion"
        terminated_alone(quickstart)
    log = quickstart.log()
    assert not json_lines(quickstart)
    assert "IOP Edge ready" in log
    assert not [line for line in quickstart.output if " INFO " in line or " DEBUG " in line]
    assert "iop.access" not in log
    assert receiver.posts == 0
