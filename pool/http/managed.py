"""Managed credential mode on the surface: route keys, candidate providers, lease envelopes.

R-MGD-3 / R-AUTH-5: a route key is looked up by its sha256 in the route table
(``pool.http.route_table``, read by ``catalog.route_reader`` when routes or slots change and
installed here: no ORM in this package, R-MGD-12); the route binds, before admission, the
providers it may use and the slot, profile, credential revision and route revision of each.
R-MGD-4: after the lease, the slot secret is unsealed from the keyring and sealed again to
the chosen Node for that one run. R-MGD-7: the key files are read once, at start
(``ManagedKeys.load``); an apply builds a new ``ManagedPlane`` over the same keys.
docs/credentials.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from catalog.config import EdgeSnapshot, KeyFile
from catalog.keyring import Keyring, KeyringError
from nodes.envelope import (
    Binding,
    EphemeralKeys,
    KeyFileError,
    KeyFileExposed,
    SealRefused,
    SlotGrant,
    issue,
    load_key,
)
from obskit.logs import printable
from pool.http.auth import Headers, presented_token
from pool.http.errors import HttpError, model_not_found
from pool.http.route_table import Grant, RouteTable, SlotUse
from secretref.keyfiles import PrivateFileError, check_private

__all__ = ["Grant", "ManagedKeys", "ManagedPlane", "RouteCredentials", "SlotUse"]

log = logging.getLogger("iop.http")


def load_issuer_key(key: KeyFile) -> Ed25519PrivateKey:
    what = "credential_plane.issuer.private_key_file"
    return load_key(key.path, what, Ed25519PrivateKey, "Ed25519", private=True)


def load_recipient_key(node_id: str, key: KeyFile) -> X25519PublicKey:
    what = f"nodes[{node_id}].credential_recipient.public_key_file"
    return load_key(key.path, what, X25519PublicKey, "X25519", private=False)


def load_keyring(path: str) -> Keyring:
    try:
        keyring = Keyring.load(path)
    except KeyringError as exc:
        raise KeyFileError(f"credential_plane.keyring_file: {exc}") from None
    try:  # R-TLS-5: key material others can read is refused at start, with the fix
        check_private(path, "credential_plane.keyring_file")
    except PrivateFileError as exc:
        raise KeyFileExposed(str(exc)) from None
    return keyring


class ManagedKeys:
    """The managed key files, read once at start (R-MGD-7: restart-required paths), and the
    route table now in force (R-MGD-12), swapped whole by ``install``."""

    def __init__(
        self,
        issuer_id: str,
        issuer: Ed25519PrivateKey,
        keyring: Keyring,
        keyring_file: str,
        recipients: dict[str, tuple[str, X25519PublicKey]],
    ) -> None:
        self.issuer_id = issuer_id
        self.issuer = issuer
        self.keyring_file = keyring_file
        self.recipients = recipients  # node id -> (key id, X25519 public key)
        self.ephemeral = EphemeralKeys()  # R-MGD-12: one key agreement per Node per minute
        self.table = RouteTable("", {}, keyring)
        self._labels: tuple[RouteTable, dict[str, str]] = (self.table, {})

    def route_labels(self) -> dict[str, str]:
        """Route id -> principal of the table in force, for metering labels (R-MGD-13); the
        same dict until the table is swapped."""
        table, labels = self._labels
        if table is not self.table:
            table = self.table
            labels = {grant.route_id: grant.principal_ref for grant in table.grants.values()}
            self._labels = (table, labels)
        return labels

    @classmethod
    def load(cls, snapshot: EdgeSnapshot) -> ManagedKeys:
        """Every key file of the snapshot's managed mode; ``KeyFileError`` names the first
        that does not load (the start is refused, R-MGD-4)."""
        plane = snapshot.credential_plane
        assert plane is not None, "managed mode only"
        issuer = load_issuer_key(plane.issuer)
        keyring = load_keyring(plane.keyring_file)
        recipients = {}
        for node in snapshot.nodes:
            if node.credential_recipient is not None:
                key = node.credential_recipient
                recipients[node.id] = (key.key_id, load_recipient_key(node.id, key))
        return cls(plane.issuer.key_id, issuer, keyring, plane.keyring_file, recipients)

    def install(self, table: RouteTable) -> None:
        """Swap in a table ``catalog.route_reader`` read (the request path only reads
        ``table``, one attribute, so a request holds the table it started with)."""
        self.table = table


class ManagedPlane:
    """Managed mode for one snapshot, over the keys read at start."""

    def __init__(
        self,
        snapshot: EdgeSnapshot,
        keys: ManagedKeys,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        plane = snapshot.credential_plane
        assert plane is not None, "managed mode only"
        self.snapshot = snapshot
        self.keys = keys
        self._ttl_s = plane.envelope_ttl_s
        self._clock = clock

    def authenticate(self, headers: Headers, x_api_key: bool) -> Grant:
        """The route of the presented key, else ``invalid_api_key`` (401): one dict lookup."""
        token = presented_token(headers, x_api_key)
        grant = self.keys.table.grant(token) if token else None
        if grant is None:
            raise HttpError("invalid_api_key")
        return grant

    def excluded(self, grant: Grant, model: str) -> frozenset[str]:
        """R-MGD-3: the group's providers the route has no slot of the right family for;
        the pool leaves them out like providers that already failed (R-HEALTH-1)."""
        group = self.snapshot.models.get(model)
        if group is None or model != grant.model_group:  # R-MGD-9: outside the route's scope
            raise model_not_found(model)
        excluded = []
        for provider_id in group.providers:
            provider = self.snapshot.providers.get(provider_id)
            slot = grant.slot_for(provider) if provider is not None else None
            family = self.snapshot.profile_family(slot.profile) if slot is not None else None
            if (
                provider is None
                or family is None
                or family != self.snapshot.profile_family(provider.profile.name)
            ):
                excluded.append(provider_id)
        if len(excluded) == len(group.providers):
            raise HttpError(
                "no_available_provider", "this route has no usable slot for any provider"
            )
        return frozenset(excluded)

    def sealer(self, grant: Grant, provider_id: str) -> Callable[[str, str, int], dict[str, Any]]:
        """Issues the run's lease envelope once the hub knows its run id and generation."""

        def seal(run_id: str, node_id: str, generation: int) -> dict[str, Any]:
            slot = grant.slot_for(self.snapshot.providers[provider_id])
            if slot is None:
                raise HttpError("credential_unavailable", "the provider has no credential")
            return self._issue(
                grant.keyring, slot, grant.revision, provider_id, run_id, node_id, generation
            )

        return seal

    def slot_grant(self, grant: Grant, provider_id: str) -> SlotGrant | None:
        """What another Edge holding the provider's Node needs to issue the envelope."""
        provider = self.snapshot.providers.get(provider_id)
        slot = grant.slot_for(provider) if provider is not None else None
        if slot is None:
            return None
        return SlotGrant(slot.slot_id, slot.credential_revision, grant.revision, slot.sealed)

    def binds(self, slot_id: str, provider_id: str) -> bool:
        """R-MGD-14: an enabled route of this Edge's own table binds this slot to this
        provider, and the slot's profile is of the provider's profile family."""
        provider = self.snapshot.providers.get(provider_id)
        if provider is None:
            return False
        family = self.snapshot.profile_family(provider.profile.name)
        if family is None:
            return False
        for route in self.keys.table.grants.values():
            slot = route.slot_for(provider)
            if slot is not None and slot.slot_id == slot_id:
                return self.snapshot.profile_family(slot.profile) == family
        return False

    def routed_sealer(
        self, grant: SlotGrant, provider_id: str
    ) -> Callable[[str, str, int], dict[str, Any]]:
        """R-SCALE-7: the envelope of a run routed here from another Edge, issued by this Edge
        (which holds the Node's connection generation) with the binding that Edge resolved,
        for a pair its own route table binds (R-MGD-14): whoever writes the order (another
        Edge, or anything that can write to Redis) cannot have another slot sealed."""
        if not self.binds(grant.slot_id, provider_id):
            log.warning(
                "routed run refused: slot %s is not bound to provider %s by an enabled route "
                "of this Edge within one profile family (R-MGD-14)",
                printable(grant.slot_id, 100), printable(provider_id, 100),
            )  # fmt: skip
            raise SealRefused("the slot is not bound to this provider by an enabled route")
        slot = SlotUse(grant.slot_id, "", grant.credential_revision, grant.sealed)

        def seal(run_id: str, node_id: str, generation: int) -> dict[str, Any]:
            try:
                return self._issue(self.keys.table.keyring, slot, grant.route_revision,
                                   provider_id, run_id, node_id, generation)  # fmt: skip
            except HttpError as exc:
                raise SealRefused(exc.message) from None

        return seal

    def _issue(self, keyring: Keyring, slot: SlotUse, route_revision: int, provider_id: str,
               run_id: str, node_id: str, generation: int) -> dict[str, Any]:  # fmt: skip
        recipient = self.keys.recipients.get(node_id)
        if recipient is None:
            raise HttpError("credential_unavailable", "the provider has no credential")
        secret = _unseal(keyring, slot)
        now = self._clock()
        binding = Binding(
            run_id=run_id,
            node_id=node_id,
            provider_id=provider_id,
            slot_id=slot.slot_id,
            credential_revision=slot.credential_revision,
            route_revision=route_revision,
            generation=generation,
        )
        return issue(
            secret,
            binding,
            recipient_key_id=recipient[0],
            recipient=recipient[1],
            issuer_key_id=self.keys.issuer_id,
            issuer=self.keys.issuer,
            now=now,
            ttl_s=self._ttl_s,
            shared=self.keys.ephemeral.for_recipient(recipient[0], recipient[1], now),
        )


def _unseal(keyring: Keyring, slot: SlotUse) -> bytes:
    """The slot's secret, or 503 ``credential_unavailable`` naming the slot (never a key)."""
    try:
        return keyring.open(slot.sealed, slot.slot_id)
    except KeyringError as exc:  # names the slot and the key id, never a key
        log.error("credential slot cannot be unsealed: %s", exc)
    raise HttpError(
        "credential_unavailable", f"the credential of slot {slot.slot_id!r} cannot be unsealed"
    )


class RouteCredentials:
    """One request's route: the providers it may not lease, and the envelope for the one
    leased."""

    __slots__ = ("_grant", "_plane", "excluded")

    def __init__(self, plane: ManagedPlane, grant: Grant, model: str) -> None:
        self._plane = plane
        self._grant = grant
        self.excluded = plane.excluded(grant, model)

    def sealer(self, provider_id: str) -> Callable[[str, str, int], dict[str, Any]]:
        return self._plane.sealer(self._grant, provider_id)

    def slot_grant(self, provider_id: str) -> SlotGrant | None:
        return self._plane.slot_grant(self._grant, provider_id)


def routed_sealer(
    plane: ManagedPlane | None, grant: SlotGrant, provider_id: str
) -> Callable[[str, str, int], dict[str, Any]]:
    """The owner Edge's side of R-SCALE-7 (``RunRouter.issuer``): refused unless this Edge runs
    managed mode too."""
    if plane is None:
        raise SealRefused("the Edge holding the node is not in managed mode")
    return plane.routed_sealer(grant, provider_id)
