"""What belongs to one Edge and not to the shared config document: its id and its listen
addresses (docs/configuration.md, "Several Edges").

Several Edges run one config document (one active revision); each may listen elsewhere. The
overrides are laid over the loaded snapshot for this process only: the document, its digest
and therefore the shared revision stay the same on every Edge.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from catalog.config.addresses import HostPort, is_loopback_host, parse_host_port

if TYPE_CHECKING:
    from catalog.config import EdgeSnapshot

EDGE_ID_PATTERN = r"[A-Za-z0-9_.-]{1,64}"
EDGE_ID_WHAT = "1 to 64 letters, digits, '_', '.' or '-'"
ROLES = ("edge", "openai", "admin")  # in the order the config document names them


class LocalSettingError(ValueError):
    """A per-Edge setting cannot be used; ``str`` names the setting and the reason."""


@dataclass(frozen=True, slots=True)
class EdgeLocal:
    """This Edge's id and listen overrides; None keeps the config document's value."""

    edge_id: str | None = None
    edge_listen: str | None = None
    openai_listen: str | None = None
    admin_listen: str | None = None

    @classmethod
    def from_settings(cls, settings: Any, **flags: str | None) -> EdgeLocal:
        """``IOP_EDGE_ID`` / ``IOP_*_LISTEN`` from settings, each replaced by its ``runedge``
        flag when one is given (``edge_id=``, ``edge_listen=``, ...)."""
        values = {
            "edge_id": settings.IOP_EDGE_ID,
            "edge_listen": settings.IOP_EDGE_LISTEN,
            "openai_listen": settings.IOP_OPENAI_LISTEN,
            "admin_listen": settings.IOP_ADMIN_LISTEN,
        }
        for name, value in flags.items():
            if value is not None:
                values[name] = value
        if values["edge_id"] is not None:
            values["edge_id"] = check_edge_id(values["edge_id"], "--edge-id")
        for role in ROLES:
            key = f"{role}_listen"
            if values[key] is not None:
                values[key] = check_listen(values[key], f"--{role}-listen")
        return cls(**values)

    def localize(self, snapshot: EdgeSnapshot) -> EdgeSnapshot:
        """``snapshot`` with this Edge's listen addresses; raise LocalSettingError when the
        result breaks a listener rule (admin on loopback, three distinct ports)."""
        if self.edge_listen is None and self.openai_listen is None and self.admin_listen is None:
            return snapshot
        local = replace(
            snapshot,
            edge_listen=_address(self.edge_listen, snapshot.edge_listen),
            openai_listen=_address(self.openai_listen, snapshot.openai_listen),
            admin_listen=_address(self.admin_listen, snapshot.admin_listen),
        )
        if not is_loopback_host(local.admin_listen.host):  # R-REF-1
            raise LocalSettingError(
                f"admin listen {local.admin_listen}: must be a loopback address "
                "(127.0.0.0/8, ::1 or localhost)"
            )
        ports: dict[int, str] = {}
        for role in ROLES:
            if role == "openai" and not local.openai_enabled:
                continue
            port = getattr(local, f"{role}_listen").port
            if port in ports:
                raise LocalSettingError(
                    f"{role} listen: port {port} is already used by the {ports[port]} listener"
                )
            ports[port] = role
        return local

    def resolved_edge_id(self, snapshot: EdgeSnapshot) -> str:
        """The id given, else ``<hostname>-<edge listener port>`` (docs/configuration.md)."""
        if self.edge_id is not None:
            return self.edge_id
        port = f"-{snapshot.edge_listen.port}"
        host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname()) or "edge"
        return host[: 64 - len(port)] + port


def _address(override: str | None, configured: HostPort) -> HostPort:
    return configured if override is None else parse_host_port(override)


def check_edge_id(value: str, where: str) -> str:
    if not re.fullmatch(EDGE_ID_PATTERN, value):
        raise LocalSettingError(f"{where}: must be {EDGE_ID_WHAT}, got {value!r}")
    return value


def check_listen(value: str, where: str) -> str:
    try:
        return str(parse_host_port(value))
    except ValueError as exc:
        raise LocalSettingError(f"{where}: {exc}, got {value!r}") from None
