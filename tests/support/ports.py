"""Loopback ports for the listeners a test starts: never the same one twice in a process, and
never one a parallel test process holds.

A port is handed out only if

- this process has not handed it out before (``bind(0)`` then ``close`` may give the same
  port to two calls in a row, so a Stack's Edge and admin listeners could collide);
- no other process holds it: each handed-out port is a POSIX record lock on its byte of one
  shared file (``LOCK_FILE``), held until this process exits (the kernel drops it then, also
  on a crash), so parallel pytest processes (xdist, other checkouts) skip it;
- it lies outside the kernel's ephemeral range (``ip_local_port_range``), from which
  ``bind(0)`` and every outgoing connection take their ports: nothing else on the machine is
  given it between the check and the child's own bind;
- 127.0.0.1 can be bound on it right now.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import socket
import tempfile
import threading
from pathlib import Path

LOCK_FILE = Path(tempfile.gettempdir()) / "iop-test-ports.lock"
LOWEST = 10000  # below: well-known services (PostgreSQL 5432, Redis 6379)
HIGHEST = 65535
FALLBACK_EPHEMERAL = (32768, 60999)  # Linux's default when /proc cannot be read

_lock = threading.Lock()
_handed_out: set[int] = set()
_lock_fd: int | None = None
_random = random.Random()  # seeded per process: parallel processes start at different ports


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (inclusive)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return FALLBACK_EPHEMERAL


def candidates() -> list[int]:
    """Every port free_port may hand out, outside the ephemeral range."""
    low, high = ephemeral_range()
    return [p for p in range(LOWEST, HIGHEST + 1) if not low <= p <= high]


def _shared_lock_fd() -> int:
    """The shared lock file, opened once and never closed: closing any descriptor of it would
    drop every lock this process holds on it."""
    global _lock_fd
    if _lock_fd is None:
        _lock_fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    return _lock_fd


def _locked_by_us(port: int) -> bool:
    """Take the cross-process lock on ``port``; False if another process holds it."""
    try:
        fcntl.lockf(_shared_lock_fd(), fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port, os.SEEK_SET)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    return True


def bindable(port: int) -> bool:
    """127.0.0.1:port can be bound now (no listener, no lingering connection on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def claim(port: int) -> bool:
    """Hand out ``port`` if no one has it; the caller holds ``_lock``."""
    if port in _handed_out or not bindable(port) or not _locked_by_us(port):
        return False
    _handed_out.add(port)
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 for one listener, reserved for this process's lifetime."""
    ports = candidates()
    start = _random.randrange(len(ports))
    with _lock:
        for port in ports[start:] + ports[:start]:
            if claim(port):
                return port
    raise RuntimeError("no free loopback port left outside the ephemeral range")
