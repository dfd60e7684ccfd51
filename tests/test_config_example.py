"""The reference example and the shipped configs load as written, GLM block included (R-PROF-7)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from catalog.config import load_file, load_snapshot, parse_text
from tests.support.processes import EDGE_YAML
from tests.support.processes import ROOT as REPO

# The contract's reference documents, kept in the repository so every checkout tests them.
REFERENCE = Path(__file__).resolve().parent / "data" / "reference"
SPEC_EXAMPLE = REFERENCE / "edge.example.yaml"
SPEC_NODE_EXAMPLE = REFERENCE / "node.example.yaml"
NODE_YAML = REPO / "configs" / "node.yaml"


def uncomment_glm(text: str) -> str:
    """Uncomment the example's GLM providers and models, keeping their indentation."""
    out, inside = [], False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# - id: glm"):
            inside = True
        elif not stripped.startswith("# ") or stripped.startswith("# ---"):
            inside = False
        if inside:
            line = line.replace("# ", "", 1)
        out.append(line)
    return "\n".join(out) + "\n"


def _texts() -> list[Path]:
    return [SPEC_EXAMPLE, EDGE_YAML]


@pytest.mark.parametrize("path", _texts(), ids=lambda p: p.name)
def test_example_loads_as_written(path):
    snapshot = load_file(path)
    assert snapshot.edge_id == "edge-local"
    assert set(snapshot.providers) == {"ollama-local", "vllm-local", "echo-cli"}
    assert list(snapshot.models) == ["qwen-local", "echo"]
    assert snapshot.max_queue == 16 and snapshot.queue_timeout_ms == 30000


@pytest.mark.parametrize("path", _texts(), ids=lambda p: p.name)
def test_glm_profiles_are_only_commented_out_in_the_example_r_prof_7(path):
    """R-PROF-7: both GLM providers appear in the example, commented out and disabled."""
    text = path.read_text()
    active = [line for line in text.splitlines() if re.match(r"\s*-?\s*profile: glm", line)]
    assert active == []
    assert "#   profile: glm\n" in text and "#   profile: glm_coding\n" in text
    assert text.count("#   enabled: false") == 2


@pytest.mark.parametrize("path", _texts(), ids=lambda p: p.name)
def test_example_glm_block_uncommented_loads_as_two_separate_providers_r_prof_7(path):
    """R-PROF-7: General API and Coding Plan are separate providers, endpoints and credentials."""
    snapshot = load_snapshot(parse_text(uncomment_glm(path.read_text())))
    general, coding = snapshot.providers["glm-general"], snapshot.providers["glm-coding"]
    assert general.profile.name == "glm" and coding.profile.name == "glm_coding"
    assert general.enabled is False and coding.enabled is False
    assert general.profile.resolve_operation_url("chat_completions") == (
        "https://api.z.ai/api/paas/v4/chat/completions"
    )
    assert coding.profile.resolve_operation_url("chat_completions") == (
        "https://api.z.ai/api/coding/paas/v4/chat/completions"
    )
    assert general.credential is not None and general.credential.env == "ZAI_API_KEY"
    assert coding.credential is not None and coding.credential.env == "ZAI_CODING_PLAN_KEY"
    # The endpoint is chosen only by which provider the external model maps to.
    assert dict(snapshot.models["glm-4.6"].providers) == {"glm-general": "glm-4.6"}
    assert dict(snapshot.models["glm-4.6-coding"].providers) == {"glm-coding": "glm-4.6"}
    for spec in (general, coding):
        assert "responses" not in spec.profile.operations
        assert "responses" not in spec.profile.capabilities


def test_uncomment_glm_changes_only_the_glm_lines():
    text = SPEC_EXAMPLE.read_text()
    changed = [
        (a, b)
        for a, b in zip(text.splitlines(), uncomment_glm(text).splitlines(), strict=True)
        if a != b
    ]
    assert len(changed) == 16
    assert all("glm" in a or a.strip().startswith(("#   ", "# - id: glm")) for a, _ in changed)


def test_shipped_edge_config_matches_the_example_document():
    """configs/edge.yaml is the reference example plus documented additions only, less the
    legacy ``openai.bearer_token`` (commented out there: the quickstart starts without the
    warning an unset legacy token gives, docs/configuration.md)."""
    shipped = load_file(EDGE_YAML).document
    assert "bearer_token" not in shipped["openai"]
    reference = load_file(SPEC_EXAMPLE).document
    reference["openai"].pop("bearer_token", None)
    assert shipped == reference


def test_shipped_node_config_is_the_node_example():
    """The shipped node.yaml is the reference document; its comments may document more keys."""
    document = parse_text(NODE_YAML.read_text())
    assert document["node_id"] == "node-local"
    assert document["token"] == {"env": "IOP_NODE_TOKEN"}
    assert document == parse_text(SPEC_NODE_EXAMPLE.read_text())
