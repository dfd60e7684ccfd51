"""Catalog tables <-> config document (the shape of configs/edge.yaml), both ways, losslessly.

Import validates the whole document first (R-CFG-5) and replaces the catalog in one transaction;
export rebuilds the document from the tables in document order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.db import models, transaction

from catalog import config
from catalog.config.errors import ConfigError
from catalog.models import (
    EdgeSettings,
    ModelGroup,
    ModelProvider,
    Node,
    OrderedRow,
    PrincipalToken,
    ProtocolProfile,
    Provider,
    is_absent,
)

if TYPE_CHECKING:  # the loader is imported when first used (catalog/config/__init__.py)
    from catalog.config import EdgeSnapshot

_INT32 = range(-(2**31), 2**31)


class CatalogMismatch(RuntimeError):
    """The tables could not hold a document exactly (a bug: the import is rolled back)."""


def catalog_to_document() -> dict[str, Any]:
    """The catalog as a config document (plain dicts and lists, document order)."""
    settings = EdgeSettings.objects.filter(pk=EdgeSettings.SINGLETON_PK).first()
    document: dict[str, Any] = {}
    for section, columns in EdgeSettings.sections.items():
        body = _entry(settings, columns, EdgeSettings.section_extras[section]) if settings else {}
        if section == "openai":
            tokens = [_entry(row, row.columns) for row in PrincipalToken.objects.all()]
            if tokens:
                body["principal_tokens"] = tokens
        if body:
            document[section] = body
    profiles = {row.name: _entry(row, row.columns) for row in ProtocolProfile.objects.all()}
    if profiles:
        document["protocol_profiles"] = profiles
    nodes = []
    providers = _group(Provider.objects.all(), "node_id")
    for node in Node.objects.all():
        entry = _entry(node, node.columns)
        entry["providers"] = [_entry(row, row.columns) for row in providers.get(node.pk, [])]
        nodes.append(entry)
    if nodes:
        document["nodes"] = nodes
    targets = _group(ModelProvider.objects.select_related("provider"), "model_group_id")
    groups = []
    for group in ModelGroup.objects.all():
        entry = _entry(group, group.columns)
        entry["providers"] = {t.provider.key: t.served_model for t in targets.get(group.pk, [])}
        groups.append(entry)
    if groups:
        document["models"] = groups
    if settings:
        document.update(settings.other_sections)
    return document


def document_to_catalog(document: Mapping[str, Any]) -> None:
    """Replace the whole catalog with `document`; raise ConfigError (writing nothing) if invalid."""
    snapshot = config.load_snapshot(document)
    with transaction.atomic():
        clear_catalog()
        _write(snapshot.document)  # the canonical form: defaults written in, legacy keys promoted
        try:
            reproduced = config.load_snapshot(catalog_to_document()) == snapshot
        except ConfigError:
            reproduced = False
        if not reproduced:
            raise CatalogMismatch("the catalog tables do not reproduce the imported document")


def validate_catalog() -> EdgeSnapshot:
    """Load the catalog as the config loader would; raise ConfigError with every issue."""
    return config.load_snapshot(catalog_to_document())


@contextmanager
def validated_change() -> Iterator[None]:
    """Run catalog edits in a transaction that is kept only if the whole catalog still loads."""
    with transaction.atomic():
        yield
        validate_catalog()


def catalog_is_empty() -> bool:
    """True when no table of the catalog holds a row."""
    tables: tuple[type[models.Model], ...] = (
        EdgeSettings,
        ProtocolProfile,
        Node,
        ModelGroup,
        PrincipalToken,
    )
    return not any(table.objects.exists() for table in tables)


def clear_catalog() -> None:
    """Delete every catalog row (children first: mappings protect their providers)."""
    for table in (ModelProvider, ModelGroup, Provider, Node, ProtocolProfile, PrincipalToken):
        table.objects.all().delete()
    EdgeSettings.objects.all().delete()


def _entry(row: models.Model, columns: Mapping[str, str], extra: str = "settings") -> dict:
    entry = {key: getattr(row, field) for key, field in columns.items()}
    entry = {key: value for key, value in entry.items() if not is_absent(value)}
    entry.update(getattr(row, extra))
    return entry


def _group(rows: models.QuerySet, attr: str) -> dict[int, list]:
    grouped: dict[int, list] = {}
    for row in rows:
        grouped.setdefault(getattr(row, attr), []).append(row)
    return grouped


def _fits(field: models.Field, value: object) -> bool:
    """Whether a document value can sit in `field` and come back out unchanged."""
    if isinstance(field, models.JSONField):
        return value is not None
    if isinstance(field, models.BooleanField):
        return isinstance(value, bool)
    if isinstance(field, models.IntegerField):
        return isinstance(value, int) and not isinstance(value, bool) and value in _INT32
    if isinstance(field, models.CharField):
        return isinstance(value, str) and 0 < len(value) <= (field.max_length or 0)
    return False


def _split(
    model: type[models.Model], entry: Mapping[str, Any], columns: Mapping[str, str], skip=()
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Document entry -> (column values, other keys). Values a column cannot hold stay JSON."""
    values: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, value in entry.items():
        if key in skip:
            continue
        field = model._meta.get_field(columns[key]) if key in columns else None
        if field is not None and _fits(field, value):
            values[field.name] = value
        elif value is not None or field is None:
            rest[key] = value
    return values, rest


def _row(model: type[OrderedRow], entry: Mapping[str, Any], order: int, **links) -> OrderedRow:
    values, rest = _split(model, entry, model.columns, model.child_keys)
    if "id" in model.columns and "key" not in values:
        raise CatalogMismatch(f"{model.__name__} entry without a usable id")
    for name in model.columns.values():
        field = model._meta.get_field(name)
        if name not in values and (field.null or isinstance(field, models.CharField)):
            values[name] = None if field.null else ""  # absent: no model default sneaks in
    return model.objects.create(order=order, settings=rest, **values, **links)


def _write(document: Mapping[str, Any]) -> None:
    settings = EdgeSettings()
    for section, columns in EdgeSettings.sections.items():
        body = document.get(section)
        if body is None:
            continue
        skip = EdgeSettings.section_children.get(section, frozenset())
        values, rest = _split(EdgeSettings, body, columns, skip)
        for name, value in values.items():
            setattr(settings, name, value)
        setattr(settings, EdgeSettings.section_extras[section], rest)
    known = EdgeSettings.table_sections | EdgeSettings.sections.keys()
    settings.other_sections = {k: v for k, v in document.items() if k not in known}
    settings.save()
    openai = document.get("openai") or {}
    for order, entry in enumerate(openai.get("principal_tokens") or ()):
        _row(PrincipalToken, entry, order)
    for order, (name, overlay) in enumerate((document.get("protocol_profiles") or {}).items()):
        _row(ProtocolProfile, overlay, order, name=name)
    providers: dict[str, Provider] = {}
    for order, entry in enumerate(document.get("nodes") or ()):
        node = _row(Node, entry, order)
        for position, provider_entry in enumerate(entry.get("providers") or ()):
            provider = _row(Provider, provider_entry, position, node=node)
            providers[provider.key] = provider
    for order, entry in enumerate(document.get("models") or ()):
        group = _row(ModelGroup, entry, order)
        for position, (provider_id, served) in enumerate((entry.get("providers") or {}).items()):
            ModelProvider.objects.create(
                model_group=group,
                provider=providers[provider_id],
                served_model=served,
                order=position,
            )


__all__ = [
    "CatalogMismatch",
    "ConfigError",
    "catalog_is_empty",
    "catalog_to_document",
    "clear_catalog",
    "document_to_catalog",
    "validate_catalog",
    "validated_change",
]
