from __future__ import annotations

from django.apps import AppConfig


class PoolConfig(AppConfig):
    """The pool's Django side: the usage ledger and the status views."""

    name = "pool"
    default_auto_field = "django.db.models.BigAutoField"
