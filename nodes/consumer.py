"""The Node websocket endpoint at /ws/node: a thin consumer over ``NodeHub``."""

from __future__ import annotations

import logging
from typing import Any

from channels.consumer import AsyncConsumer
from channels.exceptions import StopConsumer

from nodes import wire
from nodes.hub import NodeHub, NodeSession

log = logging.getLogger("iop.nodes")
# scope["extensions"] key: the names of the client certificate the Node presented, when its
# listener asks for one (edge.tls.client_ca_file; iop_site/edge_server.py puts them there).
PEER_NAMES = "iop.peer_names"


def _header(scope: dict[str, Any], name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return ""


class NodeConsumer(AsyncConsumer):
    """Authenticates before accept, then hands every frame to the hub.

    ``dispatch`` is overridden on purpose: Channels would close old database
    connections (a thread hop) before every frame, and this consumer never
    touches the ORM (docs/architecture.md: the Node websocket consumer).
    """

    def __init__(self, hub: NodeHub) -> None:
        super().__init__()
        self.hub = hub
        self.session: NodeSession | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Read frames straight from the server, one at a time: with no channel layer,
        Channels' ``await_many_dispatch`` would only add a task and an ``asyncio.wait``
        per frame (measured at ~4% of Edge CPU, docs/performance.md)."""
        self.scope = scope
        self.base_send = send
        try:
            while True:
                await self.dispatch(await receive())
        except StopConsumer:
            pass
        finally:
            # However the connection ends (a disconnect, an exception in a handler, the task
            # cancelled), the hub learns at once that this generation is gone: its providers
            # go offline and its runs end as node_gone, without waiting for the heartbeat.
            if self.session is not None:
                session, self.session = self.session, None
                await self.hub.disconnect(session)

    async def dispatch(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "websocket.receive":
            if self.session is not None:
                data = message.get("bytes")
                await self.hub.receive(self.session, data if data is not None else message["text"])
        elif kind == "websocket.connect":
            await self._connect()
        elif kind == "websocket.disconnect":
            raise StopConsumer  # the hub is told in __call__

    async def _connect(self) -> None:
        node_id = _header(self.scope, wire.NODE_ID_HEADER.encode())
        auth = _header(self.scope, b"authorization")
        token = auth[7:] if auth[:7].lower() == "bearer " else ""
        if not node_id or not token:
            log.warning("node connection refused: no X-IOP-Node-Id or bearer token")
            await self.send({"type": "websocket.close"})  # before accept: HTTP 403
            return
        if not self.hub.authenticate(node_id, token):
            await self.send({"type": "websocket.close"})  # before accept: HTTP 403
            return
        names = self.scope.get("extensions", {}).get(PEER_NAMES)
        if names is not None and node_id not in names:  # mutual TLS: the certificate's node
            log.warning(
                "node connection refused: node %r presented a client certificate for %s",
                node_id,
                ", ".join(repr(n[:64]) for n in names[:4]) or "no name",
            )
            await self.send({"type": "websocket.close"})  # before accept: HTTP 403
            return
        # R-HA-4: a Node that offers this protocol's subprotocol is told this Edge speaks it
        offered = wire.WIRE_SUBPROTOCOL in self.scope.get("subprotocols", ())
        accept = {"type": "websocket.accept"}
        if offered:
            accept["subprotocol"] = wire.WIRE_SUBPROTOCOL
        await self.send(accept)
        self.session = await self.hub.connect(node_id, _Transport(self))


class _Transport:
    """What the hub needs of a connection: send a frame, close with a code."""

    __slots__ = ("_consumer",)

    def __init__(self, consumer: NodeConsumer) -> None:
        self._consumer = consumer

    async def send(self, frame: bytes) -> None:
        await self._consumer.send({"type": "websocket.send", "bytes": frame})

    async def close(self, code: int) -> None:
        await self._consumer.send({"type": "websocket.close", "code": code})
