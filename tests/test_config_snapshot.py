"""The snapshot: immutable, canonical, round-trips through its own document."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog.config import EdgeSnapshot, HostPort, load_file, load_snapshot
from tests.support.config import load_issues
from tests.support.config_examples import example_document
from tests.support.processes import ROOT as REPO


def test_snapshot_and_its_parts_are_frozen():
    snapshot = load_snapshot(example_document())
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.max_queue = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.providers["compat-a"].capacity = 9  # type: ignore[misc]
    with pytest.raises(TypeError):
        snapshot.providers["new"] = snapshot.providers["compat-a"]  # type: ignore[index]
    with pytest.raises(TypeError):
        snapshot.models["echo"].providers["x"] = "y"  # type: ignore[index]
    with pytest.raises(TypeError):
        snapshot.providers["compat-a"].profile.operations["models"] = "/x"  # type: ignore[index]


def test_document_is_a_fresh_copy_each_time():
    snapshot = load_snapshot(example_document())
    document = snapshot.document
    document["provider_pool"]["max_queue"] = 999
    assert snapshot.document["provider_pool"]["max_queue"] == 16


def test_document_is_canonical_json_with_defaults_applied():
    snapshot = load_snapshot(example_document())
    document = snapshot.document
    assert json.loads(json.dumps(document)) == document
    assert set(document) == {
        "edge",
        "admin",
        "openai",
        "provider_pool",
        "credential_plane",
        "protocol_profiles",
        "nodes",
        "models",
    }
    assert document["edge"]["bootstrap_dir"] == "var/bootstrap"
    assert document["openai"]["max_request_bytes"] == 8 * 1024 * 1024
    assert document["openai"]["provider_auth"]["from_header"] == "X-IOP-Provider-Authorization"
    cli = document["nodes"][0]["providers"][2]
    assert cli["run_timeout_ms"] == 300000 and cli["type"] == "cli"


@pytest.mark.parametrize(
    "path",
    [REPO / "configs" / "edge.yaml", REPO / "tests" / "data" / "reference" / "edge.example.yaml"],
)
def test_document_round_trips_for_the_shipped_configs(path):
    snapshot = load_file(path)
    again = load_snapshot(snapshot.document)
    assert again == snapshot
    assert again.document == snapshot.document
    assert again.digest == snapshot.digest


_pool_fields = {
    "capacity": st.integers(1, 64),
    "priority": st.integers(-5, 500),
    "enabled": st.booleans(),
}
_optional_fields = {
    "concurrency": st.integers(0, 8),
    "first_byte_timeout_ms": st.integers(1, 10**6),
}
_providers = st.fixed_dictionaries(_pool_fields, optional=_optional_fields)
# Only one provider carries legacy queue keys, so they can never disagree.
_legacy_provider = st.fixed_dictionaries(
    _pool_fields,
    optional={
        **_optional_fields,
        "max_queue": st.integers(0, 3),
        "queue_timeout_ms": st.integers(0, 10**6),
    },
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    compat=_legacy_provider,
    ollama=_providers,
    pool=st.fixed_dictionaries(
        {}, optional={"max_queue": st.integers(0, 100), "queue_timeout_ms": st.integers(0, 10**6)}
    ),
    threshold=st.integers(1, 131072),
    attribution=st.sampled_from([None, "provider", "model_group"]),
)
def test_any_valid_document_round_trips_through_its_canonical_form(
    compat, ollama, pool, threshold, attribution
):
    document = example_document()
    document["provider_pool"] = pool
    document["openai"]["long_context_threshold_tokens"] = threshold
    providers = document["nodes"][0]["providers"]
    providers[0].update(compat)
    providers[0]["long_context_capacity"] = 1
    providers[1].update(ollama)
    if attribution is not None:
        document["models"][0]["usage_attribution"] = attribution
    snapshot = load_snapshot(document)
    again = load_snapshot(snapshot.document)
    assert again == snapshot
    assert again.document == snapshot.document
    expected_queue = pool.get("max_queue") or compat.get("max_queue") or 16
    assert snapshot.max_queue == expected_queue


def test_equal_documents_give_equal_snapshots_and_digests():
    first, second = load_snapshot(example_document()), load_snapshot(example_document())
    assert first == second and first.digest == second.digest
    changed = example_document()
    changed["nodes"][0]["providers"][0]["capacity"] = 3
    assert load_snapshot(changed) != first
    assert load_snapshot(changed).digest != first.digest


def test_listen_addresses_parse_to_host_port():
    document = example_document()
    document["edge"]["listen"] = "0.0.0.0:7700"
    document["admin"]["listen"] = "[::1]:7701"
    document["openai"]["listen"] = "api.internal:443"
    snapshot = load_snapshot(document)
    assert snapshot.edge_listen == HostPort("0.0.0.0", 7700)
    assert snapshot.admin_listen == HostPort("::1", 7701)
    assert str(snapshot.admin_listen) == "[::1]:7701"
    assert str(snapshot.openai_listen) == "api.internal:443"
    assert snapshot.document["admin"]["listen"] == "[::1]:7701"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("127.0.0.1", "must be host:port (IPv6 as [addr]:port)"),
        ("127.0.0.1:0", "port must be an integer in 1..65535"),
        ("127.0.0.1:65536", "port must be an integer in 1..65535"),
        ("127.0.0.1:http", "port must be an integer in 1..65535"),
        ("::1:8080", "IPv6 hosts must be written in brackets: [addr]:port"),
        ("[nothost]:80", "bracketed host must be an IPv6 address"),
        (":8080", "must be host:port (IPv6 as [addr]:port)"),
        ("bad host:80", "host is not a valid hostname or address"),
    ],
)
def test_bad_listen_values_are_rejected_with_the_reason(value, message):
    document = example_document()
    document["openai"]["listen"] = value
    assert load_issues(document) == [f"openai.listen: {message}"]


def test_listen_port_must_be_a_string_not_a_number():
    document = example_document()
    document["edge"]["listen"] = 7700
    assert load_issues(document) == ["edge.listen: must be a string"]


def test_openai_additions_max_request_bytes_and_metrics_token():
    document = example_document()
    snapshot = load_snapshot(document)
    assert snapshot.max_request_bytes == 8 * 1024 * 1024 and snapshot.metrics_token is None
    document["openai"]["max_request_bytes"] = 1024
    document["openai"]["metrics_token"] = {"env": "IOP_METRICS_TOKEN"}
    snapshot = load_snapshot(document)
    assert snapshot.max_request_bytes == 1024 and snapshot.metrics_token.env == "IOP_METRICS_TOKEN"
    document["openai"]["max_request_bytes"] = 1023
    assert load_issues(document) == ["openai.max_request_bytes: must be >= 1024"]


def test_openai_ingress_can_be_disabled_and_defaults_are_exposed():
    document = example_document()
    document["openai"] = {"enabled": False}
    snapshot = load_snapshot(document)
    assert snapshot.openai_enabled is False
    assert snapshot.openai_listen == HostPort("127.0.0.1", 8080)
    assert snapshot.bearer_token is None and snapshot.principal_tokens == ()


def test_a_nearly_empty_document_takes_every_default():
    snapshot = load_snapshot({})
    assert isinstance(snapshot, EdgeSnapshot)
    assert (snapshot.edge_id, str(snapshot.edge_listen), str(snapshot.admin_listen)) == (
        "edge-local",
        "127.0.0.1:7700",
        "127.0.0.1:7701",
    )
    assert snapshot.nodes == () and dict(snapshot.models) == {}
    assert (snapshot.max_queue, snapshot.queue_timeout_ms) == (16, 30000)
    assert snapshot.credential_plane_enabled is False


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
def test_config_package_never_imports_django():
    code = (
        "import sys, catalog.config;"
        "bad = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.'));"
        "print(','.join(bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == ""


def test_snapshot_parts_are_hashable_despite_read_only_mappings():
    snapshot = load_snapshot(example_document())
    assert len({snapshot, load_snapshot(example_document())}) == 1
    assert len({spec for spec in snapshot.providers.values()}) == 3
    assert hash(snapshot.models["echo"]) == hash(load_snapshot(example_document()).models["echo"])
