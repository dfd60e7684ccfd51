"""Managed mode's routes and slots as one immutable in-memory table (R-MGD-12).

A request looks its route key up here by sha256: no ORM, no thread hop and no file read on
the request path. ``catalog.route_reader`` builds the table from the catalog when routes or
slots change (a save in this process, a rotation, or a change another process made, seen by
the version poll of ``iop_site.credential_watch``) and hands it in whole, as a snapshot is
handed; a request holds the one it started with. Slots stay sealed in it: a secret is
unsealed only while its run's envelope is sealed. docs/credentials.md, "Live changes and
rotation".
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from catalog.config import ProviderSpec
from catalog.keyring import Keyring
from pool.http.auth import Caller


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
    """Enabled routes by key sha256, as of ``version`` (``catalog.route_reader``'s fingerprint)."""

    version: str
    grants: Mapping[str, Grant]
    keyring: Keyring
    slots: int = 0
    missing_key: bool = False  # a slot is sealed under a key id ``keyring`` lacks

    def grant(self, token: bytes) -> Grant | None:
        return self.grants.get(hashlib.sha256(token).hexdigest())

    def status(self) -> dict[str, Any]:
        """For ``/pool``: which table this Edge serves from (never a key or a hash)."""
        return {"version": self.version, "routes": len(self.grants), "slots": self.slots}
