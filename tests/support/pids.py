"""Process checks for tests that kill commands (Linux /proc and pidfd)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path


def reaped(pid: int) -> bool:
    """True once ``pid`` is gone entirely (not even a zombie)."""
    return not Path(f"/proc/{pid}").exists()


async def wait_exit(pid: int, within: float = 5.0) -> None:
    """Wait until a process (not necessarily our child) has terminated, via a pidfd."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    exited = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(fd, exited.set)
    try:
        async with asyncio.timeout(within):
            await exited.wait()
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def alive(pid: int) -> bool:
    """True while ``pid`` is a running (not zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def descendants(pid: int) -> list[tuple[int, str]]:
    """Every live process below ``pid``, parents first, each with its command line."""
    found: list[tuple[int, str]] = []
    queue = [pid]
    while queue:
        parent = queue.pop(0)
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                children = [int(c) for c in task.read_text().split()]
            except FileNotFoundError:
                continue
            for child in children:
                try:
                    argv = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
                except FileNotFoundError:
                    continue
                found.append((child, argv.decode(errors="replace").strip()))
                queue.append(child)
    return found
