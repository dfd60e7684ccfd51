"""Managed mode's routes and slots as one immutable in-memory table (R-MGD-12).

A request looks its route key up here by sha256: no ORM, no thread hop and no file read on
the request path. The table is built from the catalog when routes or slots change (a save in
this process, a rotation, or a change another process made, seen by the version poll of
``iop_site.credential_watch``) and swapped whole; a request holds the one it started with.
Slots stay sealed in it: a secret is unsealed only while its run's envelope is sealed.
docs/credentials.md, "Live changes and rotation".
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from catalog.config import ProviderSpec
from catalog.keyring import Keyring, KeyringError
from pool.http.auth import Caller

log = logging.getLogger("iop.http")


@dataclass(frozen=True, slots=True)
class SlotUse:
    """A slot as the table holds it: still sealed."""

    slot_id: str
    profile: str
    credential_revision: int
    sealed: str


@dataclass(frozen=True, slots=True)
class Grant:
    """A route, bound before admission (R-AUTH-5), with the keyring that opens its slots."""

    route_id: str
    principal_ref: str
    model_group: str
    revision: int
    slots: Mapping[str, SlotUse]  # provider id or profile name -> slot
    keyring: Keyring = field(compare=False, repr=False)
    caller: Caller = field(init=False, compare=False)

    def __post_init__(self) -> None:
        # R-MGD-9: a route key's scope is its one model group, exactly as a principal token's
        # ``models``: every other group answers model_not_found, /v1/models lists only it.
        caller = Caller(self.principal_ref, self.route_id, models=frozenset({self.model_group}))
        object.__setattr__(self, "caller", caller)

    def slot_for(self, provider: ProviderSpec) -> SlotUse | None:
        """A provider's own binding wins over its profile's."""
        return self.slots.get(provider.id) or self.slots.get(provider.profile.name)


@dataclass(frozen=True, slots=True)
class RouteTable:
    """Enabled routes by key sha256, as of ``version`` (what ``table_version`` read)."""

    version: str
    grants: Mapping[str, Grant]
    keyring: Keyring
    slots: int = 0

    def grant(self, token: bytes) -> Grant | None:
        return self.grants.get(hashlib.sha256(token).hexdigest())

    def status(self) -> dict[str, Any]:
        """For ``/pool``: which table this Edge serves from (never a key or a hash)."""
        return {"version": self.version, "routes": len(self.grants), "slots": self.slots}


def table_version() -> str:
    """A cheap fingerprint of the route and slot rows (three aggregate queries): it changes
    whenever a route, a binding or a slot is added, removed, edited or re-sealed."""
    from django.db.models import Count, Max, Q, Sum

    from catalog.models import CredentialSlot, Route, RouteSlot

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
    """The enabled routes with their slots, from the catalog (synchronous: a worker thread
    or a command, never the event loop). The keyring file is read again only when a slot
    is sealed under a key ``keyring`` does not hold (``iop_keyring rotate`` ran)."""
    from catalog.models import CredentialSlot, RouteSlot

    version = table_version()
    bindings = RouteSlot.objects.filter(route__enabled=True).select_related("route", "slot")
    by_route: dict[int, tuple[Any, dict[str, SlotUse]]] = {}
    for b in bindings:
        slot = SlotUse(b.slot.key, b.slot.profile, b.slot.credential_revision, b.slot.sealed)
        by_route.setdefault(b.route_id, (b.route, {}))[1][b.target] = slot
    if any(keyring.missing_key(s.sealed) for _, slots in by_route.values() for s in slots.values()):
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
    return RouteTable(version, grants, keyring, CredentialSlot.objects.count())
