"""TLS on every listener with real processes: the OpenAI SDK over https, Nodes over wss and
mutual TLS, and every bad certificate refused with a clear line (R-TLS-1, R-TLS-2).
Certificates are minted in the test (tests.support.tls)."""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support import Stack
from tests.support.tls import Pair, Pki

pytestmark = pytest.mark.slow


def _tls(pair: Pair, client_ca: Path | None = None) -> dict[str, str]:
    doc = {"cert_file": str(pair.cert), "key_file": str(pair.key)}
    if client_ca is not None:
        doc["client_ca_file"] = str(client_ca)
    return doc


def _node(config: dict[str, Any]) -> list[dict[str, Any]]:
    providers = [{"id": "p-openai", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 4}]
    return [{"id": "node-1", "providers": providers, "config": config}]


def _wait_log(stack: Stack, index: int, needle: str, timeout: float = 20.0) -> str:
    """The Node's log once it contains ``needle``; AssertionError after ``timeout``."""
    log = stack.nodes[index].log
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if needle in text:
            return text
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} not in the Node log:\n{stack.logs()[-4000:]}")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def mtls(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """An Edge with TLS on both public listeners and mutual TLS for Nodes; one good Node."""
    client = pki.client("node-1")
    node = {"tls": {"ca_file": str(pki.ca_file), "cert_file": str(client.cert),
                    "key_file": str(client.key)}}  # fmt: skip
    with Stack(
        tmp_path_factory.mktemp("mtls"),
        edge={"tls": _tls(pki.edge, client_ca=pki.ca_file)},
        openai={"tls": _tls(pki.edge)},
        nodes=_node(node),
        env={"IOP_HTTPS": "1"},
    ) as stack:
        yield stack


def _sdk(stack: Stack, pki: Pki) -> openai.OpenAI:
    """The official SDK over https, trusting only the test CA."""
    return openai.OpenAI(
        base_url=stack.v1_url,
        api_key=stack.token,
        http_client=httpx.Client(verify=ssl.create_default_context(cafile=pki.ca_file)),
        max_retries=0,
    )


def test_openai_sdk_over_https_is_served_by_a_node_over_mutual_tls(mtls: Stack, pki: Pki):
    """R-TLS-1, R-TLS-2: https to the Edge, the Node on wss:// with its client certificate."""
    with _sdk(mtls, pki) as client:
        reply = client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content
        chunks = list(
            client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "hi"}], stream=True
            )
        )
    assert any(c.choices and c.choices[0].delta.content for c in chunks)
    mtls.wait_idle()


def test_a_node_over_plain_wss_serves_the_sdk_over_https(tmp_path: Path, pki: Pki):
    """R-TLS-2 without mutual TLS: the Node verifies the Edge with tls.ca_file only."""
    with Stack(
        tmp_path,
        edge={"tls": _tls(pki.edge)},
        openai={"tls": _tls(pki.edge)},
        nodes=_node({"tls": {"ca_file": str(pki.ca_file)}}),
    ) as stack:
        with _sdk(stack, pki) as client:
            reply = client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "hi"}]
            )
        assert reply.choices[0].message.content
        stack.wait_idle()


def test_startup_line_prints_https_and_wss(mtls: Stack):
    """R-TLS-1: the ready line names the scheme each listener really speaks."""
    assert mtls.edge is not None
    line = next(x for x in mtls.edge.log.read_text().splitlines() if x.startswith("IOP Edge ready"))
    assert f"edge=wss://127.0.0.1:{mtls.ports['edge']}" in line
    assert f"openai=https://127.0.0.1:{mtls.ports['openai']}" in line
    assert f"admin=http://127.0.0.1:{mtls.ports['admin']}" in line


def test_the_admin_behind_tls_sets_secure_cookies_and_hsts(mtls: Stack, pki: Pki):
    """R-TLS-1 with IOP_HTTPS=1: the login page's CSRF cookie is Secure, HSTS is sent."""
    verify = ssl.create_default_context(cafile=pki.ca_file)
    with httpx.Client(base_url=mtls.openai_url, verify=verify) as client:
        page = client.get("/admin/login/")
    assert page.status_code == 200
    assert "max-age=31536000" in page.headers["strict-transport-security"]
    cookie = next(c for c in page.headers.get_list("set-cookie") if c.startswith("csrftoken="))
    assert "Secure" in cookie


def test_manage_check_deploy_passes_with_iop_https(tmp_path: Path):
    """The documented way to run the admin behind TLS passes Django's deployment checks."""
    env = {**os.environ, "IOP_HTTPS": "1", "IOP_VAR_DIR": str(tmp_path)}
    env.pop("SECRET_KEY", None)
    run = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr


def test_plain_http_to_the_tls_port_gets_no_answer(mtls: Stack):
    """R-TLS-1: a cleartext request to a TLS listener is never served."""
    with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
        urllib.request.urlopen(f"http://127.0.0.1:{mtls.ports['openai']}/v1/models", timeout=5)


def test_plain_websocket_to_the_tls_node_port_is_refused(mtls: Stack):
    """R-TLS-1: a ws:// upgrade to the wss:// listener gets no upgrade."""
    with socket.create_connection(("127.0.0.1", mtls.ports["edge"]), timeout=5) as sock:
        sock.sendall(
            b"GET /ws/node HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        try:
            answer = sock.recv(4096)
        except (ConnectionError, TimeoutError):
            answer = b""
    assert b"101" not in answer


def _tls_client_handshake(port: int, context: ssl.SSLContext) -> None:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        if not tls.recv(1):
            raise ConnectionError("closed")


@pytest.mark.parametrize("old", ["TLS 1.1", "TLS 1.2 with RSA key exchange and CBC"])
def test_old_protocols_and_weak_ciphers_are_refused(mtls: Stack, pki: Pki, old: str):
    """R-TLS-1: TLS 1.2+ with forward-secret AEAD suites only."""
    context = pki.client_context()
    if old == "TLS 1.1":
        with warnings.catch_warnings():  # the client side is deliberately old here
            warnings.simplefilter("ignore", DeprecationWarning)
            context.minimum_version = ssl.TLSVersion.TLSv1
            context.maximum_version = ssl.TLSVersion.TLSv1_1
        context.set_ciphers("DEFAULT:@SECLEVEL=0")  # so only the server can refuse
    else:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
        context.set_ciphers("AES128-SHA:AES256-SHA:AES128-GCM-SHA256")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _tls_client_handshake(mtls.ports["openai"], context)
    modern = pki.client_context()
    modern.maximum_version = ssl.TLSVersion.TLSv1_2
    _tls_client_handshake(mtls.ports["openai"], modern)  # TLS 1.2 itself is fine


def test_a_client_without_a_certificate_is_refused_by_mutual_tls(mtls: Stack, pki: Pki):
    """R-TLS-1: with client_ca_file, a peer that presents no certificate never gets through."""
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _tls_client_handshake(mtls.ports["edge"], pki.client_context())


@pytest.mark.parametrize("kind", ["expired", "self_signed", "wrong_ca"])
def test_a_bad_client_certificate_is_refused_by_mutual_tls(mtls: Stack, pki: Pki, kind: str):
    """R-TLS-1: expired, self-signed and wrong-CA client certificates are all refused."""
    pair = {
        "expired": lambda: pki.expired(server=False),
        "self_signed": lambda: pki.self_signed(server=False),
        "wrong_ca": lambda: pki.wrong_ca(server=False),
    }[kind]()
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _tls_client_handshake(mtls.ports["edge"], pki.client_context(pair))


def test_the_good_node_certificate_passes_mutual_tls(mtls: Stack, pki: Pki):
    """The refusals above are about the certificate: the Node's own pair gets an answer."""
    _tls_client_handshake(mtls.ports["edge"], pki.client_context(pki.client("node-1")))


# --- a Node facing a bad Edge, or without what the Edge requires ------------------------------


@contextlib.contextmanager
def _refused_node(tmp: Path, edge_tls: dict[str, str], node: dict[str, Any]) -> Iterator[Stack]:
    """A running Edge and a Node that is not expected to get online."""
    stack = Stack(tmp, edge={"tls": edge_tls}, nodes=_node(node))
    try:
        yield stack.start(wait_online=False)
    finally:
        stack.stop()


@pytest.mark.parametrize("kind", ["expired", "self_signed", "wrong_name", "wrong_ca"])
def test_a_node_refuses_a_bad_edge_certificate_with_one_clear_line_and_retries(
    tmp_path: Path, pki: Pki, kind: str
):
    """R-TLS-2: the Node names the refused certificate, keeps retrying, never goes online."""
    server = {
        "expired": lambda: pki.expired(server=True),
        "self_signed": lambda: pki.self_signed(server=True),
        "wrong_name": pki.wrong_name,
        "wrong_ca": lambda: pki.wrong_ca(server=True),
    }[kind]()
    with _refused_node(tmp_path, _tls(server), {"tls": {"ca_file": str(pki.ca_file)}}) as stack:
        text = _wait_log(stack, 0, "the Edge's certificate was refused")
        _wait_log(stack, 0, "reconnecting in")
        assert stack.nodes[0].alive()
        assert "Traceback" not in text
        assert not any(p["online"] for p in stack.pool_snapshot()["providers"])


@pytest.mark.parametrize("kind", ["none", "expired", "wrong_ca"])
def test_a_node_with_no_or_a_bad_client_certificate_is_refused_by_mutual_tls(
    tmp_path: Path, pki: Pki, kind: str
):
    """R-TLS-2: against client_ca_file such a Node says why in one line, retries, and its
    providers never go online."""
    tls: dict[str, str] = {"ca_file": str(pki.ca_file)}
    if kind != "none":
        pair = pki.expired(server=False) if kind == "expired" else pki.wrong_ca(server=False)
        tls.update(cert_file=str(pair.cert), key_file=str(pair.key))
    edge_tls = _tls(pki.edge, client_ca=pki.ca_file)
    with _refused_node(tmp_path, edge_tls, {"tls": tls}) as stack:
        text = _wait_log(stack, 0, "TLS with")
        _wait_log(stack, 0, "reconnecting in")
        assert "client certificate" in text
        assert "Traceback" not in text
        assert stack.nodes[0].alive()
        assert not any(p["online"] for p in stack.pool_snapshot()["providers"])


def test_a_node_whose_client_certificate_names_another_node_is_refused_before_accept(
    tmp_path: Path, pki: Pki
):
    """Mutual TLS: a valid certificate of the same CA proves only that the CA signed it; the
    Edge also requires it to name the node id the Node claims (its common name or a DNS
    name), so one Node's certificate and another Node's token never make a session."""
    other = pki.client("node-2")
    tls = {"ca_file": str(pki.ca_file), "cert_file": str(other.cert), "key_file": str(other.key)}
    edge_tls = _tls(pki.edge, client_ca=pki.ca_file)
    with _refused_node(tmp_path, edge_tls, {"tls": tls}) as stack:
        _wait_log(stack, 0, "reconnecting in")
        assert stack.edge is not None
        deadline = time.monotonic() + 20
        line = ""
        while not line and time.monotonic() < deadline:
            found = [ln for ln in stack.edge.log.read_text().splitlines() if "node-1" in ln]
            line = next((ln for ln in found if "client certificate for 'node-2'" in ln), "")
            time.sleep(0.05)
        assert "node connection refused" in line
        assert not any(p["online"] for p in stack.pool_snapshot()["providers"])


def test_a_node_refuses_plain_ws_to_a_remote_host_unless_allowed(tmp_path: Path):
    """R-TLS-2: ws:// to a non-loopback host is a config error naming allow_plaintext."""
    config = tmp_path / "node.yaml"
    config.write_text(
        "node_id: n1\nedge_url: ws://192.0.2.10:7700/ws/node\ntoken: {env: IOP_NODE_TOKEN}\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "nodes.agent.main", "--config", str(config)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2
    assert "allow_plaintext" in run.stderr and "192.0.2.10" in run.stderr
    config.write_text(config.read_text() + "allow_plaintext: true\n")
    checked = subprocess.run(
        [sys.executable, "-m", "nodes.agent.main", "--config", str(config), "--check"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "IOP_NODE_TOKEN": "a-node-token"},  # --check resolves the token
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize(
    ("which", "how"),
    [("cert_file", "missing"), ("key_file", "a directory"), ("client_ca_file", "not PEM")],
)
def test_the_edge_refuses_to_start_when_a_tls_file_cannot_be_used(
    tmp_path: Path, pki: Pki, which: str, how: str
):
    """R-TLS-1: a missing or unreadable file refuses the start, naming the key and path."""
    tls = _tls(pki.edge, client_ca=pki.ca_file)
    broken = tmp_path / f"broken-{which}.pem"
    if how == "a directory":
        broken.mkdir()
    elif how == "not PEM":
        broken.write_text("not a certificate\n")
    tls[which] = str(broken)
    stack = Stack(tmp_path / "edge", edge={"tls": tls})
    with pytest.raises(RuntimeError, match="exited at start") as failed:
        stack.start()
    assert f"edge.tls.{which}: " in str(failed.value)
    assert str(broken) in str(failed.value)
    assert "Traceback" not in str(failed.value)
