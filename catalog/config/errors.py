"""Config issues and the one error type a failed load raises (R-CFG-5)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

ROOT = "<root>"
_SEGMENT = re.compile(r"\[(\d+)\]|([^.\[\]]+)")


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    """One problem in a config document, named by its path (``nodes[0].providers[1].capacity``)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def path_sort_key(path: str) -> tuple[tuple[int, int, str], ...]:
    """Order paths naturally: ``nodes[2]`` before ``nodes[10]``, the root first."""
    if path == ROOT:
        return ()
    return tuple(
        (1, int(index), "") if index else (0, 0, name) for index, name in _SEGMENT.findall(path)
    )


class ConfigError(Exception):
    """A rejected config document; ``issues`` holds every problem, sorted by path."""

    issues: tuple[ConfigIssue, ...]

    def __init__(self, issues: Iterable[ConfigIssue]) -> None:
        unique = list(dict.fromkeys(issues))  # keep first occurrence, drop repeats
        self.issues = tuple(sorted(unique, key=lambda issue: path_sort_key(issue.path)))
        super().__init__("\n".join(str(issue) for issue in self.issues))

    def __str__(self) -> str:
        return "\n".join(str(issue) for issue in self.issues)


def format_path(parts: Sequence[str | int]) -> str:
    """Render a location tuple as ``a.b[0].c``; an empty location is ``<root>``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or ROOT


class Issues:
    """An append-only collector that rules write to; paths are tuples or strings."""

    def __init__(self) -> None:
        self.items: list[ConfigIssue] = []

    def add(self, path: str | Sequence[str | int], message: str) -> None:
        text = path if isinstance(path, str) else format_path(path)
        self.items.append(ConfigIssue(text, message))

    def extend(self, issues: Iterable[ConfigIssue]) -> None:
        self.items.extend(issues)

    def __bool__(self) -> bool:
        return bool(self.items)

    def __len__(self) -> int:
        return len(self.items)
