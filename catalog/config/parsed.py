"""Granular parsing: each section, node, provider, model and profile is validated on its own.

An invalid item does not hide the others: cross-field rules still run over every item that
parsed, so one load reports every issue (R-CFG-5).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from catalog.config.errors import Issues
from catalog.config.schema import (
    AdminDoc,
    CredentialPlaneDoc,
    EdgeDoc,
    MeteringDoc,
    ModelDoc,
    NodeDoc,
    OpenAIDoc,
    PrincipalDoc,
    ProfileDoc,
    ProviderDoc,
    ProviderPoolDoc,
    validate_into,
)
from catalog.config.schema.base import Doc

T = TypeVar("T", bound=Doc)
SECTIONS: dict[str, type[Doc]] = {
    "edge": EdgeDoc,
    "admin": AdminDoc,
    "openai": OpenAIDoc,
    "provider_pool": ProviderPoolDoc,
    "credential_plane": CredentialPlaneDoc,
    "metering": MeteringDoc,  # R-COST-1
}
ROOT_KEYS = (*SECTIONS, "protocol_profiles", "nodes", "models", "principals")


@dataclass
class Item(Generic[T]):
    """One list or mapping entry: where it is, what was written, and the parsed doc if valid."""

    path: tuple[str | int, ...]
    raw: Mapping[str, Any]
    doc: T | None

    @property
    def raw_id(self) -> str | None:
        """The ``id`` as written (even when another field is invalid), if it is a string."""
        value = self.raw.get("id")
        return value if isinstance(value, str) and value else None


@dataclass
class NodeItem:
    """A node and its providers, each parsed separately."""

    item: Item[NodeDoc]
    providers: list[Item[ProviderDoc]] = field(default_factory=list)


@dataclass
class Parsed:
    """The parse result: sections are None when invalid, items carry None docs when invalid."""

    sections: dict[str, Doc | None]
    raw_sections: dict[str, Mapping[str, Any]]
    profiles: dict[str, Item[ProfileDoc]]
    nodes: list[NodeItem]
    models: list[Item[ModelDoc]]
    principals: list[Item[PrincipalDoc]] = field(default_factory=list)  # R-MGD-13

    def section(self, name: str, kind: type[T]) -> T | None:
        """A typed section, or None when it did not validate."""
        value = self.sections.get(name)
        return value if isinstance(value, kind) else None

    def providers(self) -> list[Item[ProviderDoc]]:
        """Every provider item of every node, in document order."""
        return [provider for node in self.nodes for provider in node.providers]


def _mapping(raw: Any) -> Mapping[str, Any]:
    return raw if isinstance(raw, Mapping) else {}


def _items(raw: Any, path: tuple[str | int, ...], issues: Issues) -> list[tuple[int, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        issues.add(path, "must be a list")
        return []
    return list(enumerate(raw))


def _item(model: type[T], raw: Any, path: tuple[str | int, ...], issues: Issues) -> Item[T]:
    return Item(path, _mapping(raw), validate_into(model, raw, path, issues))


def parse_document(document: Mapping[str, Any], issues: Issues) -> Parsed:
    """Validate every part of ``document`` that can be validated on its own."""
    for key in document:
        if key not in ROOT_KEYS:
            issues.add((str(key),), "unknown key")
    sections: dict[str, Doc | None] = {}
    raw_sections: dict[str, Mapping[str, Any]] = {}
    for name, model in SECTIONS.items():
        raw = document.get(name)
        raw_sections[name] = _mapping(raw)
        sections[name] = validate_into(model, {} if raw is None else raw, (name,), issues)
    profiles: dict[str, Item[ProfileDoc]] = {}
    raw_profiles = document.get("protocol_profiles")
    if raw_profiles is not None and not isinstance(raw_profiles, Mapping):
        issues.add(("protocol_profiles",), "must be a mapping of profile name -> overlay")
    for name, raw in _mapping(raw_profiles).items():
        profiles[str(name)] = _item(ProfileDoc, raw, ("protocol_profiles", str(name)), issues)
    nodes = []
    for index, raw_node in _items(document.get("nodes"), ("nodes",), issues):
        path: tuple[str | int, ...] = ("nodes", index)
        node = NodeItem(_item(NodeDoc, raw_node, path, issues))
        raw_providers = node.item.raw.get("providers")
        if isinstance(raw_providers, list):  # a non-list was reported by NodeDoc
            for p_index, raw_provider in enumerate(raw_providers):
                p_path = (*path, "providers", p_index)
                node.providers.append(_item(ProviderDoc, raw_provider, p_path, issues))
        nodes.append(node)
    models = [
        _item(ModelDoc, raw, ("models", index), issues)
        for index, raw in _items(document.get("models"), ("models",), issues)
    ]
    principals = [
        _item(PrincipalDoc, raw, ("principals", index), issues)
        for index, raw in _items(document.get("principals"), ("principals",), issues)
    ]
    return Parsed(sections, raw_sections, profiles, nodes, models, principals)
