"""node.yaml validation (R-AUTH-4): every error with its path, all at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodes.agent.config import NodeConfigError, load_config, parse_config

EXAMPLE = Path(__file__).resolve().parent / "data" / "reference" / "node.example.yaml"


def base(**extra: object) -> dict[str, object]:
    return {
        "node_id": "node-a",
        "edge_url": "ws://127.0.0.1:7700/ws/node",
        "token": {"env": "IOP_NODE_TOKEN"},
        **extra,
    }


def errors_of(data: object, base_dir: Path | str = ".") -> list[str]:
    with pytest.raises(NodeConfigError) as err:
        parse_config(data, base_dir=base_dir)
    return err.value.errors


def keys(tmp_path: Path) -> dict[str, object]:
    (tmp_path / "recipient.key").write_text("key material")
    (tmp_path / "issuer.pub").write_text("public key")
    return {
        "recipient_key_id": "node-a-2026",
        "recipient_private_key_file": "recipient.key",
        "issuer_key_id": "edge-2026",
        "issuer_public_key_file": "issuer.pub",
        "replay_cache_size": 4096,
    }


def test_minimal_config_loads(tmp_path):
    path = tmp_path / "node.yaml"
    path.write_text(
        "node_id: node-a\nedge_url: ws://127.0.0.1:7700/ws/node\ntoken: {file: token.txt}\n"
    )
    config = load_config(path)
    assert config.node_id == "node-a"
    assert config.token.file == str(tmp_path / "token.txt")  # relative to the config file
    assert config.credential_plane is None


def test_the_reference_example_is_valid():
    assert load_config(EXAMPLE).node_id == "node-local"


def test_literal_token_is_rejected_without_echoing_it():
    errors = errors_of(base(token="raw-secret-token-value"))
    assert errors == ["token: must be a reference {env: NAME} or {file: PATH}, not a literal"]
    assert "raw-secret-token-value" not in str(errors)


def test_unknown_keys_are_rejected_with_their_path():
    errors = errors_of(base(extra_key=1, tls={"ca_file": None, "verify": False}))
    assert sorted(errors) == ["extra_key: unknown key", "tls.verify: unknown key"]


def test_managed_mode_loads_with_wss_and_all_file_references(tmp_path):
    data = base(edge_url="wss://edge.example/ws/node", credential_plane=keys(tmp_path))
    config = parse_config(data, base_dir=tmp_path)
    assert config.credential_plane is not None
    assert config.credential_plane.recipient_private_key_file == str(tmp_path / "recipient.key")


def test_managed_mode_reports_every_problem_at_once(tmp_path):
    """R-AUTH-4: TLS transport, every key, file references, bounded replay cache."""
    plane = keys(tmp_path)
    del plane["issuer_key_id"]
    plane["recipient_private_key_file"] = "-----BEGIN PRIVATE KEY-----\nabc\n"
    plane["issuer_public_key_file"] = "missing.pub"
    plane["replay_cache_size"] = 1_000_001
    errors = errors_of(base(credential_plane=plane), tmp_path)
    assert sorted(errors) == sorted(
        [
            "credential_plane.recipient_private_key_file: must be a file path, "
            "not inline key material",
            "credential_plane.issuer_key_id: is required",
            "credential_plane.issuer_public_key_file: file not found: missing.pub",
            "credential_plane.replay_cache_size: must be <= 1000000",
            "edge_url: must use wss:// when credential_plane is set (R-AUTH-4)",
        ]
    )


@pytest.mark.parametrize(
    ("size", "message"),
    [
        (0, "must be >= 1"),
        (-5, "must be >= 1"),
        ("10", "must be an integer"),
        (True, "must be an integer"),
    ],
)
def test_replay_cache_must_be_a_bounded_integer(tmp_path, size, message):
    plane = keys(tmp_path) | {"replay_cache_size": size}
    errors = errors_of(base(edge_url="wss://e/ws/node", credential_plane=plane), tmp_path)
    assert errors == [f"credential_plane.replay_cache_size: {message}"]


def test_field_shapes_are_checked():
    errors = errors_of({"node_id": "has space", "edge_url": "http://edge", "token": {}})
    assert errors == [
        "node_id: must not contain whitespace",
        "edge_url: must start with ws:// or wss://",
        "token: set exactly one of env or file",
    ]


def test_missing_keys_and_non_mapping_documents():
    assert errors_of({}) == [
        "node_id: is required",
        "token: is required",
        "edge_url: is required (or edge_urls: a list of Edge URLs)",
    ]
    assert errors_of(["not", "a", "mapping"]) == ["(root): must be a mapping"]


def test_tls_ca_file_must_exist(tmp_path):
    errors = errors_of(base(edge_url="wss://e/ws/node", tls={"ca_file": "ca.pem"}), tmp_path)
    assert errors == ["tls.ca_file: file not found: ca.pem"]


def test_unreadable_or_invalid_yaml_file(tmp_path):
    with pytest.raises(NodeConfigError) as err:
        load_config(tmp_path / "absent.yaml")
    assert err.value.errors[0].startswith("(file): cannot read")
    bad = tmp_path / "bad.yaml"
    bad.write_text("node_id: [unclosed\n")
    with pytest.raises(NodeConfigError) as err:
        load_config(bad)
    assert err.value.errors[0].startswith("(file): not valid YAML")


def test_an_edge_url_without_the_node_path_is_refused_with_the_fix():
    """A wrong path would only ever be refused by the Edge: say so at load."""
    assert errors_of(base(edge_url="ws://127.0.0.1:7700/")) == [
        "edge_url: the path must end in /ws/node (ws://EDGE_HOST:PORT/ws/node)"
    ]
