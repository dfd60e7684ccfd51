from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from pool.runtime import EdgeRuntime


class PoolConfig(AppConfig):
    """Owns the Edge runtime for the Django side (admin, REST API, status)."""

    name = "pool"
    default_auto_field = "django.db.models.BigAutoField"
    runtime: EdgeRuntime | None = None


def attach_runtime(runtime: EdgeRuntime | None) -> None:
    from django.apps import apps

    apps.get_app_config("pool").runtime = runtime  # type: ignore[attr-defined]


def get_runtime() -> EdgeRuntime:
    from django.apps import apps

    runtime = apps.get_app_config("pool").runtime  # type: ignore[attr-defined]
    if runtime is None:
        raise ImproperlyConfigured("the Edge runtime is not running in this process")
    return runtime
