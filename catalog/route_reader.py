"""The managed route table read from the catalog (R-MGD-12): the routes, their bindings and
slots become one immutable ``pool.http.route_table.RouteTable`` handed to the running Edge's
``ManagedKeys``, as a snapshot is handed to the data plane; ``pool.http`` never queries the
ORM. Synchronous: a worker thread (``iop_site.credential_watch``), the admin's thread after a
commit, or a command; never the event loop. docs/credentials.md, "Live changes and rotation".
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from django.db.models import Count, Max, Q, Sum

from catalog.keyring import Keyring, KeyringError
from catalog.models import CredentialSlot, Route, RouteSlot
from pool.http.managed import ManagedKeys
from pool.http.route_table import Grant, RouteTable, SlotUse

log = logging.getLogger("iop.http")


def table_version() -> str:
    """A cheap fingerprint of the route and slot rows (three aggregate queries): it changes
    whenever a route, a binding or a slot is added, removed, edited or re-sealed."""
    parts = (
        Route.objects.aggregate(
            n=Count("id"),
            on=Count("id", filter=Q(enabled=True)),
            top=Max("id"),
            rev=Sum("revision"),
        ),
        RouteSlot.objects.aggregate(n=Count("id"), top=Max("id")),
        CredentialSlot.objects.aggregate(
            n=Count("id"), at=Max("updated_at"), rev=Sum("credential_revision")
        ),
    )
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def read_route_table(keyring: Keyring, keyring_file: str) -> RouteTable:
    """The enabled routes with their slots. The keyring file is read again only when a slot
    is sealed under a key ``keyring`` does not hold (``iop_keyring rotate`` ran, or ran on
    a copy of the file); the table says whether one is still missing."""
    version = table_version()
    bindings = RouteSlot.objects.filter(route__enabled=True).select_related("route", "slot")
    by_route: dict[int, tuple[Any, dict[str, SlotUse]]] = {}
    for b in bindings:
        slot = SlotUse(b.slot.key, b.slot.profile, b.slot.credential_revision, b.slot.sealed)
        by_route.setdefault(b.route_id, (b.route, {}))[1][b.target] = slot
    sealed = [s.sealed for _, slots in by_route.values() for s in slots.values()]
    if any(keyring.missing_key(s) for s in sealed):
        try:
            keyring = Keyring.load(keyring_file)
        except KeyringError as exc:  # the slot then answers credential_unavailable
            log.error("credential_plane.keyring_file: %s", exc)
    grants = {
        route.key_hash_sha256: Grant(
            route.key,
            route.principal_ref or route.key,
            route.model_group,
            route.revision,
            slots,
            keyring,
        )
        for route, slots in by_route.values()
    }
    missing = any(keyring.missing_key(s) for s in sealed)
    return RouteTable(version, grants, keyring, CredentialSlot.objects.count(), missing)


def rebuild_route_table(keys: ManagedKeys) -> RouteTable:
    """Read the routes and slots again and hand the table to ``keys`` (swapped whole)."""
    table = read_route_table(keys.table.keyring, keys.keyring_file)
    keys.install(table)
    return table


def refresh_route_table(keys: ManagedKeys) -> bool:
    """Rebuild when the rows changed since the table was read (one cheap version query
    first), or while a slot names a key the table's keyring lacks: the keyring file is then
    read again on every poll, so putting the right file in place heals without a restart.
    True when a new table was installed."""
    if table_version() == keys.table.version and not keys.table.missing_key:
        return False
    rebuild_route_table(keys)
    return True
