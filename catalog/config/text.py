"""Config text to a document: YAML 1.1 (JSON is valid YAML), duplicate keys rejected."""

from __future__ import annotations

from typing import Any

import yaml

from catalog.config.errors import ROOT, ConfigError, ConfigIssue

_Base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_Base):  # type: ignore[valid-type,misc]
    """A safe loader that refuses duplicate mapping keys (the last one would silently win)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # keys merged in with "<<" may be overridden; that is not a duplicate
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:
            continue  # an unhashable key is reported by the constructor below
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _syntax_message(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    parts = [getattr(exc, "context", None), getattr(exc, "problem", None)]
    problem = "; ".join(part for part in parts if part) or str(exc).splitlines()[0]
    if mark is not None:
        return f"YAML syntax error at line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return f"YAML syntax error: {problem}"


def parse_text(text: str | bytes) -> dict[str, Any]:
    """Parse one YAML/JSON document whose root is a mapping; raise ConfigError otherwise."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError([ConfigIssue(ROOT, f"not UTF-8 text (byte {exc.start})")]) from None
    try:
        document = yaml.load(text, Loader=_StrictLoader)  # a safe loader subclass
    except yaml.YAMLError as exc:
        raise ConfigError([ConfigIssue(ROOT, _syntax_message(exc))]) from None
    except RecursionError:  # R-IN-3: nesting deeper than the parser can follow
        raise ConfigError([ConfigIssue(ROOT, "the document is nested too deeply")]) from None
    if document is None:
        raise ConfigError([ConfigIssue(ROOT, "the document is empty")])
    if not isinstance(document, dict):
        kind = type(document).__name__
        raise ConfigError([ConfigIssue(ROOT, f"the document root must be a mapping, not {kind}")])
    return document
