"""The Edge's TLS endpoints (R-TLS-1): options built from files, refusals naming the path,
and the one hook into daphne (a test fails if its hook point moves)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from catalog.config import HostPort, TLSFiles
from iop_site.tls import Endpoints, Listener, TLSFileError, certificate_options, listeners
from tests.support.tls import Pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def test_daphne_still_builds_each_endpoint_with_its_module_level_server_from_string():
    """The hook point Endpoints.install relies on (daphne 4.2)."""
    import daphne.server

    assert "serverFromString(reactor, str(socket_description))" in inspect.getsource(
        daphne.server.Server.run
    )


def test_tls_listeners_get_an_ssl_endpoint_and_plain_ones_go_to_twisted(pki: Pki):
    from twisted.internet.endpoints import SSL4ServerEndpoint

    tls = TLSFiles(str(pki.edge.cert), str(pki.edge.key), str(pki.ca_file))
    endpoints = Endpoints(
        [Listener("edge", HostPort("127.0.0.1", 7700), tls), Listener("admin", HostPort("::1", 1))]
    )
    seen: list[str] = []
    resolve = endpoints.resolve(lambda reactor, text: seen.append(text) or "plain")
    secure, plain = endpoints.descriptions
    assert isinstance(resolve(None, secure), SSL4ServerEndpoint)
    assert resolve(None, plain) == "plain"
    assert seen == [r"tcp:port=1:interface=\:\:1:backlog=1024"]


def test_mutual_tls_options_require_a_client_certificate_from_the_ca(pki: Pki):
    from OpenSSL import SSL

    tls = TLSFiles(str(pki.edge.cert), str(pki.edge.key), str(pki.ca_file))
    context = certificate_options(tls, "edge.tls").getContext()
    mode = context.get_verify_mode()
    assert mode & SSL.VERIFY_PEER and mode & SSL.VERIFY_FAIL_IF_NO_PEER_CERT
    one_way = certificate_options(TLSFiles(str(pki.edge.cert), str(pki.edge.key)), "openai.tls")
    assert one_way.getContext().get_verify_mode() == SSL.VERIFY_NONE


def test_a_key_that_does_not_match_the_certificate_is_refused_naming_both(pki: Pki):
    other = pki.client("someone")
    with pytest.raises(TLSFileError) as refused:
        certificate_options(TLSFiles(str(pki.edge.cert), str(other.key)), "openai.tls")
    assert str(refused.value).startswith("openai.tls: ")
    assert str(pki.edge.cert) in str(refused.value) and str(other.key) in str(refused.value)


def test_the_ready_line_urls_follow_each_listeners_tls(pki: Pki, tmp_path: Path):
    tls = TLSFiles(str(pki.edge.cert), str(pki.edge.key))
    assert Listener("edge", HostPort("0.0.0.0", 7700), tls).url() == "wss://0.0.0.0:7700"
    assert Listener("edge", HostPort("127.0.0.1", 7700)).url() == "ws://127.0.0.1:7700"
    assert Listener("openai", HostPort("::", 443), tls).url() == "https://[::]:443"
    assert Listener("admin", HostPort("127.0.0.1", 7701)).url() == "http://127.0.0.1:7701"
    assert callable(listeners)
