"""The Edge's HTTP connections under daphne send small writes at once (docs/performance.md)."""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import ITCPTransport
from twisted.internet.testing import StringTransport
from zope.interface import implementer


@implementer(ITCPTransport)
class TcpTransport(StringTransport):
    """An in-memory transport that says it is TCP and remembers its socket options."""

    no_delay = False

    def setTcpNoDelay(self, enabled: bool) -> None:
        self.no_delay = bool(enabled)

    def getTcpNoDelay(self) -> bool:
        return self.no_delay

    def setTcpKeepAlive(self, enabled: bool) -> None:
        pass

    def getTcpKeepAlive(self) -> bool:
        return False

    def loseWriteConnection(self) -> None:
        pass

    def abortConnection(self) -> None:
        self.loseConnection()


def test_an_http_connection_to_daphne_turns_nagle_off() -> None:
    """daphne never sets TCP_NODELAY; Twisted's HTTP channel does from 24.10 on (the floor in
    pyproject.toml), so a response written in pieces is not held for the client's ACK."""
    import daphne.server  # noqa: F401  (installs the asyncio reactor first)
    from daphne.http_protocol import HTTPFactory

    server: Any = object()
    protocol = HTTPFactory(server).buildProtocol(None)
    transport = TcpTransport()
    protocol.makeConnection(transport)
    try:
        assert transport.getTcpNoDelay() is True
    finally:
        protocol.connectionLost(None)
