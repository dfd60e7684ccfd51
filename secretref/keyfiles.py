"""Private key files: created exclusively, owner-only, and refused when others can read them
(R-TLS-5, docs/credentials.md). One behaviour for the Edge and the Node."""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["PrivateFileError", "check_private", "create_private"]


class PrivateFileError(ValueError):
    """A private key file cannot be written or is open to others; the message names the file
    and the fix, never a key."""


def create_private(path: str | Path, data: bytes) -> None:
    """Write ``data`` to a new file readable by its owner only (0600 from the first byte).

    Never overwrites (``O_EXCL``) and never follows a symlink at ``path`` (``O_NOFOLLOW``):
    a key is made once, where it is used."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise PrivateFileError(f"{path} exists; a key file is never overwritten") from None
    except OSError as exc:
        raise PrivateFileError(f"cannot create {path} ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise PrivateFileError(f"cannot write {path} ({exc.strerror})") from None


def check_private(path: str | Path, what: str) -> None:
    """Refuse a private key file that its group or others may read or write (R-TLS-5)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # the loader that reads it reports a missing or unreadable file
    if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PrivateFileError(
            f"{what}: {path} can be read by others (mode {stat.S_IMODE(mode):o}); "
            f"run chmod 600 {path}"
        )
