"""Path diff of two canonical config documents (no Django).

Entries of keyed lists (``nodes``, their ``providers``, ``models``, principal tokens) and of
named maps are addressed by id, not by position, so reordering is not a change and paths read
like ``nodes["node-local"].providers["vllm-local"].capacity`` (R-CFG-4 path form). An added or
removed entry is one path (``models["echo"]``). A change carries the value before and after;
``refresh.report`` alone decides which of them may be shown (R-REF-6).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

ADDED, REMOVED, CHANGED = "added", "removed", "changed"
ChangeKind = Literal["added", "removed", "changed"]
ROOT = "<root>"
ABSENT: Any = type("Absent", (), {"__repr__": lambda self: "ABSENT"})()  # no value on that side


@dataclass(frozen=True, slots=True, order=True)
class Key:
    """A keyed entry in a path: a list entry's id or a named map's key."""

    name: str


Segment = str | Key
Path = tuple[Segment, ...]
ANY = Key("*")  # in patterns: any entry of a keyed list or named map

# Lists whose entries are identified by a field, and maps whose keys are user-chosen names.
KEYED_LISTS: dict[tuple[Segment, ...], str] = {
    ("nodes",): "id",
    ("nodes", ANY, "providers"): "id",
    ("models",): "id",
    ("openai", "principal_tokens"): "token_ref",
    ("principals",): "id",
}
NAMED_MAPS: tuple[tuple[Segment, ...], ...] = (
    ("protocol_profiles",),
    ("protocol_profiles", ANY, "operations"),
    ("protocol_profiles", ANY, "model_mapping"),
    ("models", ANY, "providers"),
    ("nodes", ANY, "providers", ANY, "headers"),
    ("nodes", ANY, "providers", ANY, "env"),
)
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PATTERN_TOKEN = re.compile(r"\[\*\]|\[\"((?:[^\"\\]|\\.)*)\"\]|\.?([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True, slots=True)
class Change:
    """One changed path: where, whether it was added, removed or changed, and the values
    before and after (``ABSENT`` on the side where the path does not exist)."""

    path: Path
    kind: ChangeKind
    old: Any = dataclasses.field(default=ABSENT, compare=False, repr=False)
    new: Any = dataclasses.field(default=ABSENT, compare=False, repr=False)

    @property
    def text(self) -> str:
        return render(self.path)


def render(path: Path) -> str:
    """``("nodes", Key("n1"), "alias")`` -> ``nodes["n1"].alias``; the empty path is ``<root>``."""
    out = ""
    for segment in path:
        if isinstance(segment, Key):
            out += "[" + json.dumps(segment.name, ensure_ascii=True) + "]"
        else:
            out += f".{segment}" if out else segment
    return out or ROOT


def parse_pattern(text: str) -> Path:
    """``nodes[*].providers[*].capacity`` -> a pattern path (``[*]`` matches any entry)."""
    segments: list[Segment] = []
    position = 0
    while position < len(text):
        match = _PATTERN_TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise ValueError(f"bad path pattern {text!r} at {position}")
        if match.group(0) == "[*]":
            segments.append(ANY)
        elif match.group(2) is not None:
            segments.append(match.group(2))
        else:
            segments.append(Key(json.loads(f'"{match.group(1)}"')))
        position = match.end()
    return tuple(segments)


def matches(path: Path, pattern: Path, *, subtree: bool = False) -> bool:
    """Whether ``path`` is ``pattern`` (or, with ``subtree``, inside it)."""
    if len(path) < len(pattern) or (not subtree and len(path) != len(pattern)):
        return False
    for segment, want in zip(path, pattern, strict=False):
        if want == ANY:
            if not isinstance(segment, Key):
                return False
        elif segment != want:
            return False
    return True


def same(a: Any, b: Any) -> bool:
    """Strict equality of JSON values: ``True`` is not ``1``, ``1`` is not ``1.0``."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Mapping):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def diff_documents(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """Every changed path between two canonical documents, sorted by rendered path."""
    changes = list(_walk((), old, new))
    return sorted(changes, key=lambda change: change.text)


def _keyed_field(path: Path) -> str | None:
    for pattern, field in KEYED_LISTS.items():
        if matches(path, pattern):
            return field
    return None


def _entries(items: list[Any], field: str) -> dict[str, Any] | None:
    """A keyed list as id -> entry, or None when some entry has no usable, unique id."""
    out: dict[str, Any] = {}
    for item in items:
        key = item.get(field) if isinstance(item, Mapping) else None
        if not isinstance(key, str) or key in out:
            return None
        out[key] = item
    return out


def _is_secret_ref(value: Any) -> bool:
    return isinstance(value, Mapping) and len(value) == 1 and ("env" in value or "file" in value)


def _segment(path: Path, key: Any) -> Segment:
    name = str(key)
    if any(matches(path, pattern) for pattern in NAMED_MAPS) or not _FIELD.fullmatch(name):
        return Key(name)
    return name


def _walk(path: Path, old: Any, new: Any) -> Iterator[Change]:
    if same(old, new):
        return
    if _is_secret_ref(old) or _is_secret_ref(new):
        yield Change(path, CHANGED, old, new)  # a secret reference is one value
        return
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        yield from _walk_entries(path, dict(old), dict(new), keyed=False)
        return
    field = _keyed_field(path) if isinstance(old, list) and isinstance(new, list) else None
    if field is not None:
        old_entries, new_entries = _entries(old, field), _entries(new, field)
        if old_entries is not None and new_entries is not None:
            yield from _walk_entries(path, old_entries, new_entries, keyed=True)
            return
    # Scalars, unkeyed lists (capabilities, command, filters) and type changes: one path.
    yield Change(path, CHANGED, old, new)


def _walk_entries(
    path: Path, old: dict[Any, Any], new: dict[Any, Any], *, keyed: bool
) -> Iterator[Change]:
    for key in old.keys() | new.keys():
        child = (*path, Key(str(key)) if keyed else _segment(path, key))
        if key not in old:
            yield Change(child, ADDED, new=new[key])
        elif key not in new:
            yield Change(child, REMOVED, old=old[key])
        else:
            yield from _walk(child, old[key], new[key])
