"""The Edge and the Node run on uvloop when it is installed; ``IOP_EVENT_LOOP=asyncio`` keeps
asyncio's own loop, and a value that names no loop stops either process at start
(docs/performance-history.md, "uvloop")."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from nodes.loop import LoopChoiceError, choose, install
from tests.support import Stack
from tests.support.processes import ROOT, child_env


def test_uvloop_is_the_default_when_installed_and_asyncio_can_be_asked_for() -> None:
    assert choose({}) == "uvloop"
    assert choose({"IOP_EVENT_LOOP": " AUTO "}) == "uvloop"
    assert choose({"IOP_EVENT_LOOP": "uvloop"}) == "uvloop"
    assert choose({"IOP_EVENT_LOOP": "asyncio"}) == "asyncio"


def test_a_loop_name_that_is_not_one_is_refused_with_the_variable_and_the_choices() -> None:
    with pytest.raises(LoopChoiceError, match="IOP_EVENT_LOOP: expected one of auto, uvloop"):
        choose({"IOP_EVENT_LOOP": "tokio"})


def test_install_sets_the_policy_the_next_loop_is_made_by() -> None:
    before = asyncio.get_event_loop_policy()
    try:
        assert install({"IOP_EVENT_LOOP": "uvloop"}) == "uvloop"
        loop = asyncio.new_event_loop()
        assert type(loop).__module__.startswith("uvloop")
        loop.close()
        assert install({"IOP_EVENT_LOOP": "asyncio"}) == "asyncio"
        loop = asyncio.new_event_loop()
        assert isinstance(loop, asyncio.SelectorEventLoop)
        loop.close()
    finally:
        asyncio.set_event_loop_policy(before)


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
@pytest.mark.parametrize(
    "argv",
    [["manage.py", "runedge"], ["-m", "nodes.agent.main", "--config", "missing.yaml"]],
    ids=["edge", "node"],
)
def test_the_edge_and_the_node_refuse_to_start_on_a_loop_that_is_not_one(argv) -> None:
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env=child_env({"IOP_EVENT_LOOP": "tokio"}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "IOP_EVENT_LOOP: expected one of auto, uvloop, asyncio, got 'tokio'" in done.stderr
    assert "Traceback" not in done.stderr


def _uses_uvloop(pid: int) -> bool:
    """uvloop's extension module is mapped into the process (it is imported only to run on)."""
    return "uvloop/loop." in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["", "asyncio"], ids=["default", "asyncio"])
def test_a_chat_is_relayed_the_same_on_either_loop(tmp_path: Path, loop: str) -> None:
    env = {"IOP_EVENT_LOOP": loop} if loop else {}
    with Stack(tmp_path, env=env) as stack:
        assert stack.edge and stack.edge.popen and stack.nodes[0].popen
        pids = (stack.edge.popen.pid, stack.nodes[0].popen.pid)
        with openai.OpenAI(base_url=stack.v1_url, api_key=stack.token, max_retries=0) as client:
            answer = client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "hi"}]
            )
            chunks = client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert answer.choices[0].message.content == streamed != ""
        assert [_uses_uvloop(pid) for pid in pids] == [not loop, not loop]
