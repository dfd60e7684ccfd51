"""A saved or deleted route, binding or slot reaches the running Edge's route table at once
(R-MGD-12): after the commit, the Edge of this process (the admin's, or a command run inside
it) rebuilds its table. Changes made by another process (``iop_slot``, ``iop_route``,
``iop_keyring``, another Edge) are found by the Edge's version poll
(``iop_site.credential_watch``). docs/credentials.md, "Live changes and rotation".
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete, post_save

from catalog.models import CredentialSlot, Route, RouteSlot
from edgekit.running import running_edge


def connect() -> None:
    for model in (CredentialSlot, Route, RouteSlot):
        post_save.connect(_changed, sender=model, dispatch_uid=f"iop-routes-{model.__name__}")
        post_delete.connect(_changed, sender=model, dispatch_uid=f"iop-routes-{model.__name__}")


def _changed(**_: Any) -> None:
    runtime = running_edge()
    if runtime is not None:  # only inside a running Edge; a command has none
        transaction.on_commit(runtime.credentials_changed)
