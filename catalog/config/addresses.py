"""Listen addresses and upstream URLs: parsing and the checks the rules share."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True)
class HostPort:
    """A ``host:port`` listen address; IPv6 hosts are kept without brackets."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_host_port(text: str) -> HostPort:
    """Parse ``host:port`` or ``[v6]:port``; raise ValueError with the reason."""
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
        if not sep:
            raise ValueError("must be host:port (IPv6 as [addr]:port)")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError("bracketed host must be an IPv6 address") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise ValueError("must be host:port (IPv6 as [addr]:port)")
        if ":" in host:
            raise ValueError("IPv6 hosts must be written in brackets: [addr]:port")
        if not _HOST.match(host):
            raise ValueError("host is not a valid hostname or address")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError("port must be an integer in 1..65535")
    return HostPort(host, int(port_text))


def is_loopback_host(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a usable http(s) endpoint, or None; the URL itself is never echoed."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        return "must be an http:// or https:// URL with a valid port"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    if "?" in url or "#" in url:  # a bare "?" or "#" too: it would break every joined path
        return "must not have a query or fragment"
    return None


def has_userinfo(url: str) -> bool:
    """True when the URL carries ``user[:password]@`` credentials."""
    try:
        return "@" in urlsplit(url).netloc
    except ValueError:
        return False


def is_absolute_url(value: str) -> bool:
    """True for an absolute http(s) URL (an operation given in full, R-PROF-6)."""
    try:
        parts = urlsplit(value)
    except ValueError:
        return False
    return parts.scheme.lower() in ("http", "https") and bool(parts.netloc)
