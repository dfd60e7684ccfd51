"""R-REF-2: every changed path is live or restart-required; one case per row of the table.

Live rows come from ``refresh.classify.LIVE_PARAMETERS``; everything else is restart-required
by construction, and ``RESTART_CLASSES`` names why. Each case edits the shipped config the way
an operator would and checks the path the diff reports and the class it gets.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from catalog.config import load_file
from refresh.classify import (
    LIVE,
    LIVE_PARAMETERS,
    OTHER,
    RESTART,
    RESTART_CLASSES,
    classify_path,
)
from refresh.diff import parse_pattern
from refresh.report import diff_report
from tests.support.config import Doc, provider
from tests.support.processes import EDGE_YAML

BASE = load_file(EDGE_YAML).document


def model(doc: Doc, model_id: str) -> Doc:
    return next(m for m in doc["models"] if m["id"] == model_id)


NODE = 'nodes["node-local"]'
VLLM = f'{NODE}.providers["vllm-local"]'
OLLAMA = f'{NODE}.providers["ollama-local"]'
ECHO = f'{NODE}.providers["echo-cli"]'
MODELS_MEANING = next(p.meaning for p in LIVE_PARAMETERS if p.pattern == "models")

# (case id, edit, expected path, expected class, expected reason)

CASES: list[tuple[str, Callable[[Doc], object], str, str, str]] = [
    # --- live rows -------------------------------------------------------------------------
    (
        "capacity",
        lambda d: provider(d, "vllm-local").update(capacity=6),
        f"{VLLM}.capacity",
        LIVE,
        "provider capacity (normal slots)",
    ),
    (
        "long_context_capacity",
        lambda d: provider(d, "vllm-local").update(long_context_capacity=2),
        f"{VLLM}.long_context_capacity",
        LIVE,
        "provider long-context slots",
    ),
    (
        "priority",
        lambda d: provider(d, "ollama-local").update(priority=5),
        f"{OLLAMA}.priority",
        LIVE,
        "provider priority (lower is preferred)",
    ),
    (
        "enabled",
        lambda d: provider(d, "echo-cli").update(enabled=False),
        f"{ECHO}.enabled",
        LIVE,
        "provider in the dispatch pool (R-CFG-9)",
    ),
    (
        "max_queue",
        lambda d: d["provider_pool"].update(max_queue=32),
        "provider_pool.max_queue",
        LIVE,
        "root queue bound (R-POOL-4)",
    ),
    (
        "queue_timeout_ms",
        lambda d: d["provider_pool"].update(queue_timeout_ms=0),
        "provider_pool.queue_timeout_ms",
        LIVE,
        "root queue wait bound (R-POOL-4)",
    ),
    (
        "retry_before_first_byte",
        lambda d: d["provider_pool"].update(retry_before_first_byte=2),
        "provider_pool.retry_before_first_byte",
        LIVE,
        "retries on another provider before the first byte (R-HEALTH-1)",
    ),
    (
        "eject_after_failures",
        lambda d: d["provider_pool"].update(eject_after_failures=0),
        "provider_pool.eject_after_failures",
        LIVE,
        "failures in a row that eject a provider (R-HEALTH-2)",
    ),
    (
        "eject_base_s",
        lambda d: d["provider_pool"].update(eject_base_s=2),
        "provider_pool.eject_base_s",
        LIVE,
        "first ejection length (R-HEALTH-2)",
    ),
    (
        "eject_max_s",
        lambda d: d["provider_pool"].update(eject_max_s=60),
        "provider_pool.eject_max_s",
        LIVE,
        "longest ejection (R-HEALTH-2)",
    ),
    (
        "probe_interval_s",
        lambda d: provider(d, "vllm-local").update(probe_interval_s=5),
        f"{VLLM}.probe_interval_s",
        LIVE,
        "active probe interval (R-HEALTH-3)",
    ),
    (
        "probe_command",
        lambda d: provider(d, "echo-cli").update(probe_command=["true"]),
        f"{ECHO}.probe_command",
        LIVE,
        "cli provider's probe program (R-HEALTH-3)",
    ),
    (
        "provider_price",
        lambda d: provider(d, "vllm-local").update(price={"input": 1, "output": 2}),
        f"{VLLM}.price",
        LIVE,
        "provider price per million input, output and cached input tokens (R-COST-1)",
    ),
    (
        "currency",
        lambda d: d.update(metering={"currency": "EUR"}),
        "metering",
        LIVE,
        "the currency of every price and budget amount (R-COST-1)",
    ),
    (
        "group_price",
        lambda d: model(d, "qwen-local").update(price={"input": 1, "output": 2}),
        'models["qwen-local"].price',
        LIVE,
        MODELS_MEANING,
    ),
    (
        "usage_attribution",
        lambda d: model(d, "qwen-local").update(usage_attribution="model_group"),
        'models["qwen-local"].usage_attribution',
        LIVE,
        MODELS_MEANING,
    ),
    (
        "model_mapping_changed",
        lambda d: model(d, "echo")["providers"].update({"echo-cli": "e2"}),
        'models["echo"].providers["echo-cli"]',
        LIVE,
        MODELS_MEANING,
    ),
    (
        "model_mapping_added",
        lambda d: model(d, "echo")["providers"].update({"ollama-local": "qwen2.5:7b"}),
        'models["echo"].providers["ollama-local"]',
        LIVE,
        MODELS_MEANING,
    ),
    (
        "model_added",
        lambda d: d["models"].append({"id": "echo-2", "providers": {"echo-cli": "echo"}}),
        'models["echo-2"]',
        LIVE,
        MODELS_MEANING,
    ),
    (
        "model_removed",
        lambda d: d["models"].remove(model(d, "echo")),
        'models["echo"]',
        LIVE,
        MODELS_MEANING,
    ),
    (
        "translate",
        lambda d: model(d, "echo").update(translate=True),
        'models["echo"].translate',
        LIVE,
        "serve operations a provider's driver lacks by translation (R-XLATE-1); "
        "what it would drop: named or refused (R-XLATE-5)",
    ),
    (
        "principals",
        lambda d: d.update(principals=[{"id": "team-research", "rpm": 100}]),
        "principals",
        LIVE,
        "principals' budgets and limits over all their keys (R-MGD-13)",
    ),
    (
        "max_output_tokens",
        lambda d: model(d, "echo").update(max_output_tokens=256),
        'models["echo"].max_output_tokens',
        LIVE,
        "output tokens one request may ask of the group (R-LIM-5)",
    ),
    (
        "fallbacks",
        lambda d: model(d, "echo").update(fallbacks=[d["models"][0]["id"]]),
        'models["echo"].fallbacks',
        LIVE,
        "model groups tried in order when this one cannot serve (R-FALL-1)",
    ),
    (
        "long_context_threshold",
        lambda d: d["openai"].update(long_context_threshold_tokens=50000),
        "openai.long_context_threshold_tokens",
        LIVE,
        "OpenAI long-context threshold (R-POOL-7)",
    ),
    (
        "stream_buffer_bytes",
        lambda d: d["openai"].update(stream_buffer_bytes=65536),
        "openai.stream_buffer_bytes",
        LIVE,
        "relay buffer per stream before Node backpressure (R-IN-5)",
    ),
    # --- restart-required classes -------------------------------------------------------------
    ("edge_id", lambda d: d["edge"].update(id="edge-2"), "edge.id", RESTART, "Edge identity"),
    (
        "edge_listen",
        lambda d: d["edge"].update(listen="127.0.0.1:7710"),
        "edge.listen",
        RESTART,
        "Edge listener (Node websocket)",
    ),
    (
        "edge_tls",
        lambda d: d["edge"].update(tls={"cert_file": "/a.crt", "key_file": "/a.key"}),
        "edge.tls",
        RESTART,
        "Edge transport TLS (R-AUTH-4)",
    ),
    (
        "bootstrap_dir",
        lambda d: d["edge"].update(bootstrap_dir="var/other"),
        "edge.bootstrap_dir",
        RESTART,
        "bootstrap artifact path",
    ),
    (
        "admin_listen",
        lambda d: d["admin"].update(listen="127.0.0.1:7799"),
        "admin.listen",
        RESTART,
        "admin listener (R-REF-1)",
    ),
    (
        "admin_token",
        lambda d: d["admin"].update(token={"env": "IOP_ADMIN_TOKEN"}),
        "admin.token",
        RESTART,
        "admin listener (R-REF-1)",
    ),
    (
        "openai_enabled",
        lambda d: d["openai"].update(enabled=False),
        "openai.enabled",
        RESTART,
        "OpenAI listener",
    ),
    (
        "openai_listen",
        lambda d: d["openai"].update(listen="127.0.0.1:8099"),
        "openai.listen",
        RESTART,
        "OpenAI listener",
    ),
    (
        "openai_tls",
        lambda d: d["openai"].update(tls={"cert_file": "/b.crt", "key_file": "/b.key"}),
        "openai.tls",
        RESTART,
        "OpenAI listener TLS",
    ),
    (
        "bearer_token",
        lambda d: d["openai"].update(bearer_token={"env": "OTHER_TOKEN"}),
        "openai.bearer_token",
        RESTART,
        "legacy caller token (R-AUTH-1)",
    ),
    (
        "principal_token_hash",
        lambda d: d["openai"]["principal_tokens"][0].update(token_hash_sha256="ab" * 32),
        'openai.principal_tokens["app-notebook"].token_hash_sha256',
        RESTART,
        "principal tokens (R-CFG-12)",
    ),
    (
        "principal_token_added",
        lambda d: d["openai"]["principal_tokens"].append(
            {"token_ref": "app-new", "token_hash_sha256": "cd" * 32, "principal_ref": "team"}
        ),
        'openai.principal_tokens["app-new"]',
        RESTART,
        "principal tokens (R-CFG-12)",
    ),
    (
        "principal_token_removed",
        lambda d: d["openai"]["principal_tokens"].pop(0),
        'openai.principal_tokens["app-notebook"]',
        LIVE,
        "principal token revoked (only shrinks access)",
    ),
    (
        "principal_token_models",
        lambda d: d["openai"]["principal_tokens"][0].update(models=["echo"]),
        'openai.principal_tokens["app-notebook"].models',
        LIVE,
        "model groups a principal token may call (R-PRIN-1)",
    ),
    (
        "principal_token_max_in_flight",
        lambda d: d["openai"]["principal_tokens"][0].update(max_in_flight=2),
        'openai.principal_tokens["app-notebook"].max_in_flight',
        LIVE,
        "principal token in-flight limit (R-PRIN-2)",
    ),
    (
        "principal_token_rpm",
        lambda d: d["openai"]["principal_tokens"][0].update(rpm=60),
        'openai.principal_tokens["app-notebook"].rpm',
        LIVE,
        "principal token requests per window (R-PRIN-2)",
    ),
    (
        "principal_token_tpm",
        lambda d: d["openai"]["principal_tokens"][0].update(tpm=10000),
        'openai.principal_tokens["app-notebook"].tpm',
        LIVE,
        "principal token tokens per window (R-PRIN-2)",
    ),
    (
        "principal_budget",
        lambda d: d["openai"]["principal_tokens"][0].update(
            budget={"tokens": 1000, "period": "day"}
        ),
        'openai.principal_tokens["app-notebook"].budget',
        LIVE,
        "principal token budget per UTC calendar period (R-BUD-1, R-COST-3)",
    ),
    (
        "principal_token_max_queued",
        lambda d: d["openai"]["principal_tokens"][0].update(max_queued=4),
        'openai.principal_tokens["app-notebook"].max_queued',
        LIVE,
        "principal token share of the queue (R-PRIN-3)",
    ),
    (
        "principal_token_max_pending_bodies",
        lambda d: d["openai"]["principal_tokens"][0].update(max_pending_bodies=2),
        'openai.principal_tokens["app-notebook"].max_pending_bodies',
        LIVE,
        "principal token requests still sending their body (R-LIM-2)",
    ),
    (
        "provider_auth",
        lambda d: d["openai"]["provider_auth"].update(enabled=True),
        "openai.provider_auth.enabled",
        RESTART,
        "legacy provider auth (R-AUTH-2)",
    ),
    (
        "stream_evidence_gate",
        lambda d: d["openai"]["stream_evidence_gate"].update(enabled=True),
        "openai.stream_evidence_gate.enabled",
        RESTART,
        "Stream Evidence Gate settings (R-SEG-1)",
    ),
    (
        "stream_evidence_gate_enforcement",
        lambda d: d["openai"]["stream_evidence_gate"].update(
            filters=[{"type": "repeat_guard", "enforcement": "observe"}]
        ),
        "openai.stream_evidence_gate.filters",
        RESTART,
        "Stream Evidence Gate settings (R-SEG-1)",
    ),
    (
        "max_request_bytes",
        lambda d: d["openai"].update(max_request_bytes=4096),
        "openai.max_request_bytes",
        RESTART,
        "body limit of every HTTP listener (R-IN-1)",
    ),
    (
        "header_timeout",
        lambda d: d["openai"].update(header_timeout_s=5),
        "openai.header_timeout_s",
        RESTART,
        "header deadline of every HTTP listener (R-IN-5)",
    ),
    (
        "metrics_token",
        lambda d: d["openai"].update(metrics_token={"env": "METRICS"}),
        "openai.metrics_token",
        RESTART,
        "OpenAI ingress settings",
    ),
    (
        "envelope_ttl",
        lambda d: d["credential_plane"].update(envelope_ttl_s=30),
        "credential_plane.envelope_ttl_s",
        RESTART,
        "credential plane (R-AUTH-4)",
    ),
    (
        "credential_recipient",
        lambda d: d["nodes"][0].update(
            credential_recipient={"key_id": "n-1", "public_key_file": "/etc/iop/n.pub"}
        ),
        'nodes["node-local"].credential_recipient',
        RESTART,
        "node credential recipient key (R-MGD-4)",
    ),
    (
        "credential_plane",
        lambda d: d["credential_plane"].update(enabled=True),
        "credential_plane.enabled",
        RESTART,
        "credential plane (R-AUTH-4)",
    ),
    (
        "protocol_profile",
        lambda d: d["protocol_profiles"]["local_vllm"].update(base_url="http://127.0.0.1:9/v1"),
        'protocol_profiles["local_vllm"].base_url',
        RESTART,
        "protocol profile catalog (R-PROF-1)",
    ),
    (
        "node_added",
        lambda d: d["nodes"].append(
            {"id": "node-2", "token_hash_sha256": "ef" * 32, "providers": []}
        ),
        'nodes["node-2"]',
        RESTART,
        "node add/remove",
    ),
    ("node_removed", lambda d: d.update(nodes=[]), NODE, RESTART, "node add/remove"),
    (
        "node_token",
        lambda d: d["nodes"][0].update(token_hash_sha256="12" * 32),
        f"{NODE}.token_hash_sha256",
        RESTART,
        "node token",
    ),
    (
        "node_alias",
        lambda d: d["nodes"][0].update(alias="laptop"),
        f"{NODE}.alias",
        RESTART,
        "node alias",
    ),
    (
        "provider_added",
        lambda d: d["nodes"][0]["providers"].append(
            {"id": "echo-2", "type": "cli", "command": ["cat"], "capacity": 1}
        ),
        f'{NODE}.providers["echo-2"]',
        RESTART,
        "provider add/remove",
    ),
    (
        "provider_removed",
        lambda d: d["nodes"][0]["providers"].remove(provider(d, "ollama-local")),
        OLLAMA,
        RESTART,
        "provider add/remove",
    ),
    (
        "provider_profile",
        lambda d: provider(d, "vllm-local").update(profile="openai"),
        f"{VLLM}.profile",
        RESTART,
        "provider profile selector (R-PROF-2)",
    ),
    (
        "provider_type",
        lambda d: provider(d, "echo-cli").update(type="ollama"),
        f"{ECHO}.type",
        RESTART,
        "provider profile selector (legacy type)",
    ),
    (
        "adapter_base_url",
        lambda d: provider(d, "ollama-local").update(base_url="http://127.0.0.1:11435"),
        f"{OLLAMA}.base_url",
        RESTART,
        "provider adapter settings",
    ),
    (
        "adapter_command",
        lambda d: provider(d, "echo-cli").update(command=["cat"]),
        f"{ECHO}.command",
        RESTART,
        "provider adapter settings",
    ),
    (
        "adapter_credential",
        lambda d: provider(d, "vllm-local").update(credential={"env": "K"}),
        f"{VLLM}.credential",
        RESTART,
        "provider adapter settings",
    ),
    (
        "adapter_header",
        lambda d: provider(d, "vllm-local").update(headers={"X-Org": "o"}),
        f"{VLLM}.headers",
        RESTART,
        "provider adapter settings",
    ),
    (
        "context_window",
        lambda d: provider(d, "vllm-local").update(context_window_tokens=65536),
        f"{VLLM}.context_window_tokens",
        RESTART,
        "provider adapter settings",
    ),
]


@pytest.mark.parametrize(
    ("edit", "path", "klass", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_each_edit_is_reported_at_its_path_with_its_class(edit, path, klass, reason):
    candidate = copy.deepcopy(BASE)
    edit(candidate)
    report = diff_report(BASE, candidate, mode="dry_run", outcome="dry_run").as_dict()
    assert [c["path"] for c in report["changes"]] == [path]
    [change] = report["changes"]
    assert (change["class"], change["reason"]) == (klass, reason)
    expected = "live_paths" if klass == LIVE else "restart_required_paths"
    other = "restart_required_paths" if klass == LIVE else "live_paths"
    assert report[expected] == [path]
    assert report[other] == []


# Rows no valid document can reach today (keys the loader does not accept yet): their paths
# are classified directly, so a key added later is still restart-required by construction.
SYNTHETIC = [
    ("edge.region", "Edge settings"),
    (f"{NODE}.labels", "node settings"),
    ("a2a.listen", OTHER),
    ("provider_pool.per_model_limit", OTHER),
]


@pytest.mark.parametrize(("path", "reason"), SYNTHETIC)
def test_a_path_outside_the_live_table_is_restart_required_by_construction(path, reason):
    assert classify_path(parse_pattern(path)) == (RESTART, reason)


def test_every_row_of_both_tables_has_a_case():
    covered = {c[4] for c in CASES} | {reason for _, reason in SYNTHETIC}
    rows = {p.meaning for p in LIVE_PARAMETERS} | {r.meaning for r in RESTART_CLASSES}
    assert rows - covered == set()


def test_a_live_and_a_restart_edit_together_are_both_reported():
    candidate = copy.deepcopy(BASE)
    provider(candidate, "vllm-local")["capacity"] = 8
    candidate["edge"]["listen"] = "127.0.0.1:7711"
    report = diff_report(BASE, candidate, mode="dry_run", outcome="dry_run").as_dict()
    assert report["live_paths"] == [f"{VLLM}.capacity"]
    assert report["restart_required_paths"] == ["edge.listen"]


def test_a_whole_new_provider_is_not_made_live_by_its_capacity():
    """An added provider is one restart-required path, not a live capacity path."""
    candidate = copy.deepcopy(BASE)
    candidate["nodes"][0]["providers"].append({"id": "p9", "type": "cli", "command": ["cat"]})
    report = diff_report(BASE, candidate, mode="dry_run", outcome="dry_run").as_dict()
    assert report["live_paths"] == []
    assert report["restart_required_paths"] == [f'{NODE}.providers["p9"]']


def test_the_docs_list_every_row_of_both_tables():
    docs = (EDGE_YAML.parent.parent / "docs" / "refresh.md").read_text()
    for row in (*LIVE_PARAMETERS, *RESTART_CLASSES):
        assert f"`{row.pattern}`" in docs, row.pattern
        assert row.meaning in docs, row.meaning
