"""What one ``policy.commands`` entry grants (R-TLS-6, docs/node.md, "Policy").

An entry is the exact argv the Node may exec, compared element by element, with no path
lookup. A last element ``"..."`` makes it a prefix: the argv must start with the elements
before it and may go on with any arguments. A last element ``"$"`` (how an exact entry was
written while entries were prefixes) is still accepted and means exact too.

A prefix on a shell or an interpreter (``["python3", "..."]``, ``["sh", "..."]``) lets an Edge
run any code as the Node's user; ``start_notes`` names such entries in a warning at start,
and says once what changed for a policy written when an entry was a prefix by default.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from typing import Any

PREFIX = "..."  # a last element "...": a prefix, any further arguments allowed
EXACT = "$"  # a last element "$": exact (the old way of writing it; no marker means the same)
OLD_PREFIX_HINT = 'an entry without a last "..." allows exactly its argv, R-TLS-6'

# A program that runs whatever code its arguments give it: a shell, an interpreter, or a
# launcher of another program (basename, any version suffix, ``.exe`` on Windows).
_RUNS_ANY_CODE = re.compile(
    r"^(?:a?sh|bash|dash|zsh|ksh|mksh|fish|csh|tcsh|busybox|cmd|pwsh|powershell|osascript"
    r"|python[0-9.]*|pypy[0-9.]*|node|nodejs|deno|bun|perl[0-9.]*|ruby[0-9.]*|irb|php[0-9.]*"
    r"|lua[0-9.]*|luajit|tclsh[0-9.]*|wish[0-9.]*|[gmn]?awk|java|jshell|rscript|julia|guile"
    r"|env|sudo|doas|nice|nohup|timeout|xargs|stdbuf|setsid|uv|uvx|npx|pipx)(?:\.exe)?$",
    re.IGNORECASE,
)


def split_entries(value: Any) -> Any:
    """``policy.commands`` as lists (a string is split like a shell); ValueError for an entry
    that names no program or puts ``"..."`` anywhere but last."""
    if not isinstance(value, list):
        return value
    out = []
    for item in value:
        if isinstance(item, str):
            item = shlex.split(item)
        if isinstance(item, list):
            if not [part for part in item if part not in (EXACT, PREFIX)]:
                raise ValueError("an argv entry must not be empty")
            if PREFIX in item[:-1]:
                raise ValueError(f'{shlex.join(item)}: "..." may only be the last element')
        out.append(item)
    return out


def _program(entry: Sequence[str]) -> tuple[str, ...]:
    """The argv an entry names, without its marker."""
    return tuple(entry[:-1]) if entry[-1] in (EXACT, PREFIX) else tuple(entry)


def allows(entry: Sequence[str], argv: Sequence[str]) -> bool:
    """Whether ``entry`` lets the Node exec exactly ``argv``."""
    program = _program(entry)
    if entry[-1] == PREFIX:
        return tuple(argv[: len(program)]) == program
    return tuple(argv) == program


def refusal(entries: Sequence[Sequence[str]], argv: Sequence[str]) -> str | None:
    """None when an entry allows ``argv``, else the reason; it says what changed when an
    entry without a marker would have allowed ``argv`` as the prefix it used to be."""
    if any(allows(entry, argv) for entry in entries):
        return None
    if any(_unmarked(entry) and allows([*entry, PREFIX], argv) for entry in entries):
        return f"is not an allowed command ({OLD_PREFIX_HINT})"
    return "is not an allowed command"


def _unmarked(entry: Sequence[str]) -> bool:
    return entry[-1] not in (EXACT, PREFIX)


def runs_any_code(program: str) -> bool:
    """A shell, an interpreter or a launcher: a prefix on it grants any code."""
    return bool(_RUNS_ANY_CODE.match(os.path.basename(program)))


def start_notes(entries: Sequence[Sequence[str]]) -> list[str]:
    """The warnings a Node logs at start about its ``policy.commands`` (R-TLS-6)."""
    notes = [
        f"policy.commands[{index}] {shlex.join(entry)}: a prefix on {entry[0]} (a shell or "
        "an interpreter) lets an Edge run any code as this Node's user; list the exact argv "
        "instead (R-TLS-6)"
        for index, entry in enumerate(entries)
        if entry[-1] == PREFIX and runs_any_code(entry[0])
    ]
    unmarked = [shlex.join(entry) for entry in entries if _unmarked(entry)]
    if unmarked and not any(entry[-1] == PREFIX for entry in entries):
        notes.append(
            "policy.commands: an entry now allows exactly its argv; before this version an "
            'entry without a last "$" allowed any further arguments (R-TLS-6). These entries '
            f'no longer do: {"; ".join(unmarked)}. End an entry with "..." to allow further '
            'arguments, or with "$" to keep it exact without this line (docs/node.md)'
        )
    return notes
