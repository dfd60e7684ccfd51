"""Managed credential mode on the surface: route keys, candidate providers, lease envelopes.

R-MGD-3 / R-AUTH-5: a route key is looked up by its sha256 in the catalog (one read per
request, in a worker thread, so a slot rotated a moment ago is used by the next request);
the route binds, before admission, the providers it may use and the slot, profile, credential
revision and route revision of each. R-MGD-4: after the lease, the slot secret is unsealed
from the keyring and sealed again to the chosen Node for that one run. docs/credentials.md.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from catalog.config import EdgeSnapshot, KeyFile, ProviderSpec
from catalog.keyring import Keyring, KeyringError
from nodes.envelope import (
    Binding,
    KeyFileError,
    KeyFileExposed,
    SealRefused,
    SlotGrant,
    issue,
    load_key,
)
from pool.http.auth import Caller, Headers, presented_token
from pool.http.errors import HttpError
from secretref.keyfiles import PrivateFileError, check_private

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


@dataclass(frozen=True, slots=True)
class SlotUse:
    """A slot as one request reads it: still sealed."""

    slot_id: str
    profile: str
    credential_revision: int
    sealed: str


@dataclass(frozen=True, slots=True)
class Grant:
    """A route resolved for one request (R-AUTH-5)."""

    route_id: str
    principal_ref: str
    model_group: str
    revision: int
    slots: Mapping[str, SlotUse]  # provider id or profile name -> slot

    @property
    def caller(self) -> Caller:
        return Caller(self.principal_ref, self.route_id)

    def slot_for(self, provider: ProviderSpec) -> SlotUse | None:
        """A provider's own binding wins over its profile's."""
        return self.slots.get(provider.id) or self.slots.get(provider.profile.name)


def read_grant(digest: str) -> Grant | None:
    """The enabled route whose key hashes to ``digest``, with its slots: one query (a route
    always has at least one slot)."""
    from catalog.models import RouteSlot  # the surface module loads before Django's apps

    bindings = list(
        RouteSlot.objects.filter(route__key_hash_sha256=digest, route__enabled=True).select_related(
            "route", "slot"
        )
    )
    if not bindings:
        return None
    route = bindings[0].route
    slots = {
        b.target: SlotUse(b.slot.key, b.slot.profile, b.slot.credential_revision, b.slot.sealed)
        for b in bindings
    }
    return Grant(
        route.key, route.principal_ref or route.key, route.model_group, route.revision, slots
    )


class ManagedPlane:
    """The Edge's managed-mode keys for one snapshot: issuer, keyring, each Node's recipient."""

    def __init__(
        self,
        snapshot: EdgeSnapshot,
        *,
        read: Callable[[str], Grant | None] = read_grant,
        clock: Callable[[], float] = time.time,
    ) -> None:
        plane = snapshot.credential_plane
        assert plane is not None, "managed mode only"
        self.snapshot = snapshot
        self._issuer_id = plane.issuer.key_id
        self._issuer = load_issuer_key(plane.issuer)
        self._keyring_file = plane.keyring_file
        self._keyring = load_keyring(plane.keyring_file)
        self._ttl_s = plane.envelope_ttl_s
        self._recipients: dict[str, tuple[str, X25519PublicKey]] = {}
        for node in snapshot.nodes:
            if node.credential_recipient is not None:
                key = node.credential_recipient
                self._recipients[node.id] = (key.key_id, load_recipient_key(node.id, key))
        self._read = sync_to_async(read)  # asgiref's one ORM thread (docs/credentials.md)
        self._clock = clock

    async def authenticate(self, headers: Headers, x_api_key: bool) -> Grant:
        """The route of the presented key, else ``invalid_api_key`` (401)."""
        token = presented_token(headers, x_api_key)
        grant = await self._read(hashlib.sha256(token).hexdigest()) if token else None
        if grant is None:
            raise HttpError("invalid_api_key")
        return grant

    def excluded(self, grant: Grant, model: str) -> frozenset[str]:
        """R-MGD-3: the group's providers the route has no slot of the right family for;
        the pool leaves them out like providers that already failed (R-HEALTH-1)."""
        if model != grant.model_group:
            raise HttpError(
                "route_model_mismatch",
                f"this route key serves model {grant.model_group!r} only",
                param="model",
            )
        group = self.snapshot.models.get(model)
        if group is None:
            raise HttpError("model_not_found", param="model")
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
            return self._issue(slot, grant.revision, provider_id, run_id, node_id, generation)

        return seal

    def slot_grant(self, grant: Grant, provider_id: str) -> SlotGrant | None:
        """What another Edge holding the provider's Node needs to issue the envelope."""
        provider = self.snapshot.providers.get(provider_id)
        slot = grant.slot_for(provider) if provider is not None else None
        if slot is None:
            return None
        return SlotGrant(slot.slot_id, slot.credential_revision, grant.revision, slot.sealed)

    def routed_sealer(
        self, grant: SlotGrant, provider_id: str
    ) -> Callable[[str, str, int], dict[str, Any]]:
        """R-SCALE-7: the envelope of a run routed here from another Edge, issued by this Edge
        (which holds the Node's connection generation) with the binding that Edge resolved."""
        slot = SlotUse(grant.slot_id, "", grant.credential_revision, grant.sealed)

        def seal(run_id: str, node_id: str, generation: int) -> dict[str, Any]:
            try:
                return self._issue(slot, grant.route_revision, provider_id, run_id, node_id,
                                   generation)  # fmt: skip
            except HttpError as exc:
                raise SealRefused(exc.message) from None

        return seal

    def _issue(self, slot: SlotUse, route_revision: int, provider_id: str, run_id: str,
               node_id: str, generation: int) -> dict[str, Any]:  # fmt: skip
        recipient = self._recipients.get(node_id)
        if recipient is None:
            raise HttpError("credential_unavailable", "the provider has no credential")
        secret = self._unseal(slot)
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
            issuer_key_id=self._issuer_id,
            issuer=self._issuer,
            now=self._clock(),
            ttl_s=self._ttl_s,
        )

    def _unseal(self, slot: SlotUse) -> bytes:
        """The slot's secret. The keyring file is read again when a key it does not hold
        sealed the slot (``iop_keyring rotate`` ran while the Edge was up)."""
        try:
            if self._keyring.missing_key(slot.sealed):
                self._keyring = Keyring.load(self._keyring_file)
            return self._keyring.open(slot.sealed, slot.slot_id)
        except KeyringError as exc:  # names the slot and the key id, never a key
            log.error("credential slot cannot be unsealed: %s", exc)
        raise HttpError("credential_unavailable", "the provider credential cannot be unsealed")


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
