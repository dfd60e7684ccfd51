"""A filter in observe mode through a real Edge and Node: the loop is released unchanged,
counted and logged once, and nothing is re-issued (R-SEG-8).
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support import Stack
from tests.support.payloads import chat_body

pytestmark = pytest.mark.slow

GATE = {
    "enabled": True,
    "filters": [{"type": "repeat_guard", "hold_evidence_runes": 100, "enforcement": "observe"}],
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(
        tmp_path_factory.mktemp("gate-observe"), openai={"stream_evidence_gate": GATE}
    ) as running:
        yield running


def test_observe_releases_the_loop_unchanged_and_counts_it_once_r_seg_8(stack: Stack) -> None:
    """R-SEG-8: observe detects, logs and counts, but the client gets the text as it came."""
    with (
        stack.clean_slate(),
        openai.OpenAI(base_url=stack.v1_url, api_key=stack.token, max_retries=0) as client,
    ):
        faults = stack.upstream().server.faults
        faults.loop_unit, faults.loop_copies = "echo ", 80
        chunks = client.chat.completions.create(
            **chat_body("Tell me", model="gpt-test"), stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "echo " * 80
        assert len(stack.upstream().server.requests) == 1  # nothing re-issued
    counts = {
        (s.labels["provider"], s.labels["outcome"]): s.value
        for s in stack.metrics()
        if s.name == "iop_gate_events_total"
    }
    assert counts == {("p-openai", "observed"): 1.0}
    assert stack.logs().count("observed a repeat on provider p-openai") == 1
