"""node.yaml's transport and limits keys (R-TLS-2, R-TLS-4): validated at load, by path."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from nodes.agent.client import tls_context
from nodes.agent.config import NodeConfigError, parse_config
from nodes.agent.limits import Limits
from tests.support.tls import Pki


def _doc(url: str = "wss://edge.example:7700/ws/node", **extra: object) -> dict[str, object]:
    return {"node_id": "n", "edge_url": url, "token": {"env": "T"}, **extra}


def _errors(data: dict[str, object], base_dir: Path) -> list[str]:
    with pytest.raises(NodeConfigError) as refused:
        parse_config(data, base_dir=base_dir)
    return refused.value.errors


@pytest.mark.parametrize(
    "url",
    ["ws://127.0.0.1:7700/ws/node", "ws://localhost:7700/ws/node", "ws://[::1]:7700/ws/node"],
)
def test_plain_ws_to_loopback_needs_no_permission_r_tls_2(tmp_path, url):
    assert parse_config(_doc(url), base_dir=tmp_path).allow_plaintext is False


@pytest.mark.parametrize(
    "url",
    [
        "ws://10.0.0.5:7700/ws/node",
        "ws://edge.example:7700/ws/node",
        "ws://127.0.0.1.nip.io/ws/node",
    ],
)
def test_plain_ws_to_another_host_is_refused_unless_allowed_r_tls_2(tmp_path, url):
    errors = _errors(_doc(url), tmp_path)
    assert len(errors) == 1 and errors[0].startswith("edge_url: ws:// to ")
    assert "allow_plaintext: true" in errors[0]
    assert parse_config(_doc(url, allow_plaintext=True), base_dir=tmp_path).allow_plaintext


def test_allow_plaintext_must_be_a_boolean(tmp_path):
    assert "allow_plaintext: must be true or false" in _errors(
        _doc(allow_plaintext="yes"), tmp_path
    )


def test_a_client_certificate_needs_its_key_and_every_file_must_exist(tmp_path):
    pki = Pki(tmp_path / "pki")
    pair = pki.client("n")
    assert "tls: set cert_file and key_file together" in _errors(
        _doc(tls={"cert_file": str(pair.cert)}), tmp_path
    )
    assert "tls.ca_file: file not found: missing.pem" in _errors(
        _doc(tls={"ca_file": "missing.pem"}), tmp_path
    )


def test_unusable_tls_files_are_refused_at_load_not_retried_forever(tmp_path):
    """R-TLS-2: a CA file that is not PEM, or a key that is not the certificate's, is a
    config error naming the files."""
    pki = Pki(tmp_path / "pki")
    pair, other = pki.client("n"), pki.client("m")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    assert _errors(_doc(tls={"ca_file": str(junk)}), tmp_path) == [
        f"tls: ca_file: {junk} holds no PEM certificate"
    ]
    tls = {"cert_file": str(pair.cert), "key_file": str(other.key)}
    mismatch = _errors(_doc(tls=tls), tmp_path)
    assert len(mismatch) == 1 and str(pair.cert) in mismatch[0] and str(other.key) in mismatch[0]


def test_the_tls_context_verifies_against_ca_file_and_presents_the_client_cert(tmp_path):
    """R-TLS-2: TLS 1.2+, hostname checked, the CA from tls.ca_file, our certificate loaded."""
    pki = Pki(tmp_path / "pki")
    pair = pki.client("n")
    tls = {"ca_file": str(pki.ca_file), "cert_file": str(pair.cert), "key_file": str(pair.key)}
    context = tls_context(parse_config(_doc(tls=tls), base_dir=tmp_path))
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "IOP local CA"),),)]
    plain = parse_config(_doc("ws://127.0.0.1:1/ws/node"), base_dir=tmp_path)
    assert tls_context(plain) is None


def test_limits_have_bounds_and_name_their_path_r_tls_4(tmp_path):
    errors = _errors(_doc(limits={"max_body_bytes": 10, "cli_run_timeout_s": 0}), tmp_path)
    assert "limits.max_body_bytes: must be >= 1024" in errors
    assert "limits.cli_run_timeout_s: must be > 0" in errors
    loaded = parse_config(_doc(limits={"max_line_bytes": 4096}), base_dir=tmp_path)
    assert loaded.limits == Limits(max_line_bytes=4096)


def test_a_node_refuses_to_start_on_a_tls_key_others_can_read_r_tls_5(tmp_path, capsys):
    """R-TLS-5: the client certificate's key readable by group or others stops the Node:
    one line naming the file and the fix, exit 1."""
    import yaml

    from nodes.agent.main import main

    pki = Pki(tmp_path / "pki")
    pair = pki.client("n")
    pair.key.chmod(0o644)
    (tmp_path / "token").write_text("t")
    tls = {"ca_file": str(pki.ca_file), "cert_file": str(pair.cert), "key_file": str(pair.key)}
    doc = _doc(tls=tls, token={"file": str(tmp_path / "token")})
    (tmp_path / "node.yaml").write_text(yaml.safe_dump(doc))
    assert main(["--config", str(tmp_path / "node.yaml"), "--check"]) == 1
    assert capsys.readouterr().err.strip() == (
        f"tls.key_file: {pair.key} can be read by others (mode 644); run chmod 600 {pair.key}"
    )
