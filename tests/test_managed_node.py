"""The Node in managed mode: a run's lease envelope becomes that run's upstream credential,
and every bad envelope is refused with a reason, never the secret (R-MGD-4, R-AUTH-4).

The real Node agent over wss:// against the fake Edge, with a fake upstream on loopback.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nodes import wire
from nodes.agent.main import main
from nodes.envelope import Binding, b64, unb64
from tests.fakes.edge import EdgeConn, FakeEdge
from tests.support.managed import ManagedKeys, mint_keys
from tests.support.node_agent import running_node
from tests.support.payloads import chat_body, node_payload, openai_provider
from tests.support.tls import self_signed

SECRET = b"sk-node-canary-5d1e0b7c"
NODE = "node-test"


@pytest.fixture
def keys(tmp_path) -> ManagedKeys:
    return mint_keys(tmp_path / "keys", NODE)


def binding(conn: EdgeConn, run: str, **kw) -> Binding:
    fields = {
        "run_id": run,
        "node_id": NODE,
        "provider_id": "p1",
        "slot_id": "slot-a",
        "credential_revision": 1,
        "route_revision": 1,
        "generation": conn.generation,
    }
    return Binding(**(fields | kw))


async def tunnel(conn: EdgeConn, run_id: str, envelope: dict | None, provider_id: str = "p1"):
    """Send one passthrough run carrying ``envelope``; its log once it ended."""
    conn.run(run_id)  # the run's log exists before its first event
    await conn.send(
        wire.TunnelRequest(
            run_id=run_id,
            provider_id=provider_id,
            operation="chat_completions",
            stream=False,
            body=msgspec.Raw(msgspec.json.encode(chat_body())),
            lease_envelope=envelope,
        )
    )
    return await conn.wait_end(run_id)


def refusal(log) -> str:
    (end,) = log.ends
    assert not end.ok and end.error is not None
    assert end.error.code == "credential_refused"
    assert SECRET.decode() not in end.error.message
    return end.error.message


@pytest.fixture
async def managed(fake_openai, tmp_path, keys):
    """A managed Node (keys, wss://) on a fake Edge; yields (conn, upstream)."""
    cert, server_ctx = self_signed(tmp_path)
    payload = node_payload(
        openai_provider(fake_openai.url, pid="p1", auth=wire.AuthPayload(type="bearer")),
        openai_provider(fake_openai.url, pid="p2", auth=wire.AuthPayload(type="bearer")),
        node_id=NODE,
    )
    config = {"tls": {"ca_file": str(cert)}, "credential_plane": keys.node_plane()}
    async with (
        FakeEdge(payload, node_id=NODE, ssl_context=server_ctx) as fake_edge,
        running_node(fake_edge, tmp_path, config=config),
    ):
        yield await fake_edge.next_connection(), fake_openai


async def test_the_upstream_receives_exactly_the_envelopes_secret_r_mgd_4(managed, keys, caplog):
    """R-MGD-4: the Node opens the envelope of the run it received and sends the secret as
    the provider's credential (its profile's auth: bearer), for that call; not logged."""
    caplog.set_level(logging.DEBUG)
    conn, upstream = managed
    log = await tunnel(conn, "r1", keys.envelope(SECRET, binding(conn, "r1")))
    assert log.ends[0].ok
    (request,) = upstream.requests
    assert request.headers["authorization"] == f"Bearer {SECRET.decode()}"
    assert SECRET.decode() not in caplog.text


async def test_a_replayed_envelope_is_refused_r_mgd_4(managed, keys):
    """R-MGD-4, R-AUTH-4: the replay cache refuses an envelope used once already."""
    conn, upstream = managed
    envelope = keys.envelope(SECRET, binding(conn, "r1"))
    assert (await tunnel(conn, "r1", envelope)).ends[0].ok
    conn.runs.pop("r1")  # the same run id again, as a replaying peer would send it
    message = refusal(await tunnel(conn, "r1", envelope))
    assert "already used" in message
    assert len(upstream.requests) == 1


@pytest.mark.parametrize(
    "field, value",
    [("run_id", "r-other"), ("node_id", "node-other"), ("provider_id", "p2"), ("generation", 99)],
)
async def test_an_envelope_for_another_run_node_provider_or_connection_is_refused_r_mgd_4(
    managed, keys, field, value
):
    """R-MGD-4: the binding is checked against the run the Node received."""
    conn, upstream = managed
    envelope = keys.envelope(SECRET, binding(conn, "r1", **{field: value}))
    assert f"bound to another {field}" in refusal(await tunnel(conn, "r1", envelope))
    assert upstream.requests == []


async def test_an_expired_envelope_is_refused_r_mgd_4(managed, keys):
    conn, upstream = managed
    envelope = keys.envelope(SECRET, binding(conn, "r1"), now=1_000_000.0)
    assert "expired" in refusal(await tunnel(conn, "r1", envelope))
    assert upstream.requests == []


async def test_an_envelope_signed_by_another_issuer_key_is_refused_r_mgd_4(managed, keys):
    conn, upstream = managed
    forged = keys.envelope(SECRET, binding(conn, "r1"), issuer=Ed25519PrivateKey.generate())
    assert "signature does not verify" in refusal(await tunnel(conn, "r1", forged))
    assert upstream.requests == []


async def test_a_tampered_ciphertext_is_refused_r_mgd_4(managed, keys):
    conn, upstream = managed
    envelope = keys.envelope(SECRET, binding(conn, "r1"))
    raw = bytearray(unb64(envelope["ct"]))
    raw[-1] ^= 1
    envelope["ct"] = b64(bytes(raw))
    assert "signature does not verify" in refusal(await tunnel(conn, "r1", envelope))
    assert upstream.requests == []


async def test_a_managed_node_refuses_a_run_without_an_envelope_r_mgd_4(managed):
    conn, upstream = managed
    assert "no lease envelope" in refusal(await tunnel(conn, "r1", None))
    assert upstream.requests == []


async def test_a_node_without_recipient_keys_refuses_an_envelope_r_auth_4(
    fake_openai, fake_edge, tmp_path, keys
):
    """R-AUTH-4: a Node with no credential_plane cannot open an envelope and says so."""
    async with running_node(fake_edge, tmp_path):
        conn = await fake_edge.next_connection()
        envelope = keys.envelope(SECRET, binding(conn, "r1"))
        message = refusal(await tunnel(conn, "r1", envelope))
        assert "no credential_plane recipient key" in message
        assert fake_openai.requests == []


def managed_config(tmp_path, plane: dict) -> Path:
    """A managed node.yaml naming ``plane`` (its token a file), for start checks."""
    config, token = tmp_path / "node.yaml", tmp_path / "token"
    token.write_text("t")
    doc = {"node_id": NODE, "edge_url": "wss://127.0.0.1:1/ws/node",
           "token": {"file": str(token)}, "credential_plane": plane}  # fmt: skip
    config.write_text(yaml.safe_dump(doc))
    return config


def test_a_node_whose_key_files_do_not_load_refuses_to_start(tmp_path, keys, capsys):
    """R-AUTH-4: the managed keys are checked at start; the error names the file."""
    plane = keys.node_plane()
    (tmp_path / "bad.key").write_text("not a key")
    plane["recipient_private_key_file"] = str(tmp_path / "bad.key")
    config = managed_config(tmp_path, plane)
    assert main(["--config", str(config), "--check"]) == 2
    err = capsys.readouterr().err
    bad = tmp_path / "bad.key"
    assert f"credential_plane.recipient_private_key_file: {bad} is not a PEM private key" in err


def test_keygen_makes_the_recipient_pair_on_the_node_exclusively_0600_r_tls_5(tmp_path, capsys):
    """R-TLS-5: `iop-node keygen --out DIR` writes the private key 0600 (never over an
    existing file or through a symlink) and prints the public key and its key id, which the
    Edge registers (iop_keys node) and the Node's credential_plane names."""
    import stat

    from cryptography.hazmat.primitives import serialization

    from nodes.envelope import key_id

    out = tmp_path / "keys"
    assert main(["keygen", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    key_file, pub_file = out / "recipient.key", out / "recipient.pub"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    public = serialization.load_pem_public_key(pub_file.read_bytes())
    private = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    assert private.public_key().public_bytes(  # type: ignore[union-attr]
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    ) == public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert f"recipient_key_id: {key_id(public)}" in printed  # type: ignore[arg-type]
    assert pub_file.read_text() in printed and "PRIVATE" not in printed
    first = key_file.read_bytes()
    pub_file.unlink()
    assert main(["keygen", "--out", str(out)]) == 1  # the private key is never overwritten
    assert "exists; a key file is never overwritten" in capsys.readouterr().err
    assert key_file.read_bytes() == first
    target = tmp_path / "elsewhere"
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "recipient.key").symlink_to(target)
    assert main(["keygen", "--out", str(tmp_path / "link")]) == 1
    assert not target.exists()  # a symlink is never followed


def test_a_node_refuses_to_start_on_a_recipient_key_others_can_read_r_tls_5(tmp_path, keys, capsys):
    """R-TLS-5: one line naming the file and the fix, exit 1, no traceback."""
    plane = keys.node_plane()
    key_file = plane["recipient_private_key_file"]
    os.chmod(key_file, 0o640)
    config = managed_config(tmp_path, plane)
    assert main(["--config", str(config), "--check"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        f"credential_plane.recipient_private_key_file: {key_file} can be read by others "
        f"(mode 640); run chmod 600 {key_file}"
    )
