"""docs/observability.md's start command, run as written in a copy of the checkout (what
tests.support.quickstart changes, plus: a loopback OTLP receiver stands for the collector
at 127.0.0.1:4318, and spans are exported every 100 ms): the README's request then makes one
trace with spans of both ``iop-edge`` and ``iop-node`` (R-OBS-2)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.journeys import doc_blocks, printed_json, wait_for
from tests.support.otlp import FAST_EXPORT, OtlpReceiver
from tests.support.quickstart import command_of, make_run

pytestmark = pytest.mark.slow

START = doc_blocks(ROOT / "docs" / "observability.md", "observability")["start"]
REQUEST = doc_blocks(ROOT / "README.md", "readme")["first-request"]


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    running = OtlpReceiver()
    yield running
    running.stop()


def test_the_pages_start_command_traces_a_request_across_the_edge_and_its_node(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    command = command_of(START).replace("http://127.0.0.1:4318", receiver.endpoint)
    with make_run(tmp_path, command, env=FAST_EXPORT) as quickstart:
        wait_for(lambda: quickstart.provider_online("echo-cli"), 60, "the local Node online",
                 log=quickstart.log)  # fmt: skip
        (answer,) = printed_json(quickstart.run(REQUEST))
        assert answer["object"] == "chat.completion"
        spans = receiver.wait_for(
            lambda got: {"iop-edge", "iop-node"} <= {s.service for s in got},
            what="spans of the Edge and the Node",
        )
    edge = [s for s in spans if s.service == "iop-edge"]
    node = [s for s in spans if s.service == "iop-node"]
    assert {s.trace_id for s in node} <= {s.trace_id for s in edge}
