"""Shared pieces of the catalog tables: document-faithful JSON, absent values, ordered rows."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from django.core.exceptions import ValidationError
from django.db import models


class DocumentJSONField(models.JSONField):
    """JSON kept exactly as written, key order included: stored as text on PostgreSQL.

    Export must reproduce the document (mapping order is part of it); `jsonb` reorders keys,
    and `json` has no equality operator (DISTINCT in admin searches fails on it).
    """

    def db_type(self, connection) -> str | None:
        if connection.vendor == "postgresql":
            return "text"
        return super().db_type(connection)

    def get_db_prep_value(self, value: Any, connection, prepared: bool = False) -> Any:
        if connection.vendor != "postgresql":
            return super().get_db_prep_value(value, connection, prepared)
        if not prepared:
            value = self.get_prep_value(value)
        if value is None or hasattr(value, "as_sql"):
            return value
        return json.dumps(value, cls=self.encoder)


def is_absent(value: object) -> bool:
    """A column value that stands for "key absent from the document"."""
    return value is None or value == ""


def settings_problem(
    settings: object, row: models.Model, columns: dict[str, str], child_keys: frozenset[str]
) -> str | None:
    """Why a JSON `settings`/extra value cannot sit beside its row's columns, or None."""
    if not isinstance(settings, dict):
        return "must be a JSON object"
    clash = sorted(
        key
        for key in settings
        if key in child_keys or (key in columns and not is_absent(getattr(row, columns[key])))
    )
    if clash:
        return f"keys that have their own field here: {', '.join(clash)}"
    return None


class OrderedRow(models.Model):
    """A row with a document position; new rows go last unless an order is given."""

    order = models.PositiveIntegerField(
        null=True, blank=True, help_text="Position in the config document (blank = last)."
    )
    settings = DocumentJSONField(
        default=dict, blank=True, help_text="Every other document key of this entry, as JSON."
    )

    # document key -> column; keys of child tables. `settings` holds every other key.
    columns: ClassVar[dict[str, str]] = {}
    child_keys: ClassVar[frozenset[str]] = frozenset()

    class Meta:
        abstract = True

    def siblings(self) -> models.QuerySet:
        return type(self)._default_manager.all()

    def save(self, *args, **kwargs) -> None:
        if self.order is None:
            last = self.siblings().aggregate(last=models.Max("order"))["last"]
            self.order = 0 if last is None else last + 1
        super().save(*args, **kwargs)

    def clean(self) -> None:
        super().clean()
        problem = settings_problem(self.settings, self, self.columns, self.child_keys)
        if problem:
            raise ValidationError({"settings": problem})
