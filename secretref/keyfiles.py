"""Private key files: created exclusively, owner-only, and refused when others can read them
(R-TLS-5, docs/credentials.md). One behaviour for the Edge and the Node."""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["PrivateFileError", "check_private", "create_private", "replace_private"]


class PrivateFileError(ValueError):
    """A private key file cannot be written or is open to others; the message names the file
    and the fix, never a key."""


def create_private(path: str | Path, data: bytes) -> None:
    """Write ``data`` to a new file readable by its owner only (0600 from the first byte).

    Never overwrites and never follows a symlink at ``path``: a key is made once, where it is
    used. Crash-safe (R-MGD-8): written beside ``path``, fsynced, then linked to its name in
    one step, so ``path`` is absent or complete, never a part."""
    _write_beside(Path(path), data, replace=False)


def replace_private(path: str | Path, data: bytes) -> None:
    """Replace ``path`` whole with ``data`` (0600), crash-safe (R-MGD-8): written beside it,
    fsynced, renamed over it; a crash or a full disk leaves the old file or the new one."""
    _write_beside(Path(path), data, replace=True)


def _write_beside(path: Path, data: bytes, *, replace: bool) -> None:
    temp = path.parent / f".{path.name}.{os.urandom(6).hex()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(temp, flags, 0o600)
    except OSError as exc:
        raise PrivateFileError(f"cannot create {path} ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(temp, path)
        else:
            os.link(temp, path)  # fails if anything, a symlink included, has the name
            temp.unlink()
    except FileExistsError:
        temp.unlink(missing_ok=True)
        raise PrivateFileError(f"{path} exists; a key file is never overwritten") from None
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise PrivateFileError(f"cannot write {path} ({exc.strerror})") from None
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX: the entry lives in the directory)."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
