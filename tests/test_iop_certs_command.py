"""`manage.py iop_certs`: a local CA, an Edge certificate and Node client certificates."""

from __future__ import annotations

import ipaddress
import stat
from io import StringIO

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from django.core.management import call_command


def _cert(path):  # type: ignore[no-untyped-def]
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_mints_a_ca_an_edge_certificate_for_the_names_and_node_certificates(tmp_path):
    call_command(
        "iop_certs", str(tmp_path), "--name", "edge.example.com", "--name", "10.0.0.5",
        "--node", "node-a", "--node", "node-b", stdout=StringIO(),
    )  # fmt: skip
    ca, edge = _cert(tmp_path / "ca.crt"), _cert(tmp_path / "edge.crt")
    san = edge.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["edge.example.com"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.5")]
    assert edge.issuer == ca.subject
    edge.verify_directly_issued_by(ca)
    usage = edge.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    for node_id in ("node-a", "node-b"):
        node = _cert(tmp_path / f"node-{node_id}.crt")
        node.verify_directly_issued_by(ca)
        assert list(node.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
            ExtendedKeyUsageOID.CLIENT_AUTH
        ]
    for key in tmp_path.glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key


def test_a_second_run_reuses_the_ca_so_new_nodes_join_the_same_trust(tmp_path):
    call_command("iop_certs", str(tmp_path), stdout=StringIO())
    first_ca = (tmp_path / "ca.crt").read_bytes()
    out = StringIO()
    call_command("iop_certs", str(tmp_path), "--node", "node-c", stdout=out)
    assert (tmp_path / "ca.crt").read_bytes() == first_ca
    assert "reusing CA" in out.getvalue()
    _cert(tmp_path / "node-node-c.crt").verify_directly_issued_by(_cert(tmp_path / "ca.crt"))


def test_a_second_run_keeps_the_edge_key_and_never_overwrites_a_node_key_r_tls_5(tmp_path):
    """R-TLS-5: key files are created exclusively; a rerun keeps edge.key as it is and
    refuses to mint a Node key that exists."""
    import pytest
    from django.core.management import CommandError

    call_command("iop_certs", str(tmp_path), "--node", "node-a", stdout=StringIO())
    edge_key = (tmp_path / "edge.key").read_bytes()
    out = StringIO()
    call_command("iop_certs", str(tmp_path), stdout=out)
    assert (tmp_path / "edge.key").read_bytes() == edge_key
    assert "keeping" in out.getvalue()
    with pytest.raises(CommandError, match=r"node-node-a\.key exists; keys are never overwritten"):
        call_command("iop_certs", str(tmp_path), "--node", "node-a", stdout=StringIO())
