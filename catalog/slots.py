"""Credential slots and routes in the catalog (R-MGD-1..3, R-MGD-6): the commands' and the
admin's one implementation. Secrets go in sealed and never come out of here; a route key is
returned once and only its sha256 is stored. docs/credentials.md.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from django.db import transaction

from catalog.config.errors import ConfigError
from catalog.documents import validate_catalog
from catalog.keyring import Keyring, KeyringError, new_keyring
from catalog.models import CredentialSlot, Route, RouteSlot
from edgekit.running import running_edge
from secretref.keyfiles import PrivateFileError, create_private, replace_private

if TYPE_CHECKING:
    from catalog.config import EdgeSnapshot

ROUTE_KEY_PREFIX = "iop_route_"
MAX_SECRET_BYTES = 16 * 1024
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class CredentialError(Exception):
    """A slot, route or keyring change refused; the message names what, never a secret."""


def catalog_snapshot() -> EdgeSnapshot:
    try:
        return validate_catalog()
    except ConfigError as exc:
        raise CredentialError(
            f"the catalog does not load ({len(exc.issues)} issue(s)); fix it first"
        ) from None


MANAGED_OFF = (
    "managed mode is off: the catalog has no credential_plane with enabled: true and a "
    "keyring_file (docs/credentials.md)"
)

KEYRING_HINT = "; or name the keyring with --keyring FILE"  # the commands' option


def keyring_path(snapshot: EdgeSnapshot | None, given: str | None, hint: str = "") -> str:
    """``given`` (a command's ``--keyring``) when set, else the catalog's
    ``credential_plane.keyring_file``; outside managed mode ``MANAGED_OFF`` and ``hint``."""
    if given:
        return given
    plane = (snapshot or catalog_snapshot()).credential_plane
    if plane is None:
        raise CredentialError(MANAGED_OFF + hint)
    return plane.keyring_file


def managed_mode_off() -> str | None:
    """Why routes and slots are not used here, for the admin's pages; None in managed mode.
    The running Edge's snapshot decides, else (no Edge in this process) the catalog's."""
    edge = running_edge()
    try:
        snapshot = edge.snapshot if edge is not None else catalog_snapshot()
    except CredentialError as exc:
        return str(exc)
    return MANAGED_OFF if snapshot.credential_plane is None else None


def load_keyring(path: str) -> Keyring:
    try:
        return Keyring.load(path)
    except KeyringError as exc:
        raise CredentialError(str(exc)) from None


def check_id(kind: str, value: str) -> None:
    if not _ID.match(value):
        raise CredentialError(f"{kind} id {value!r} must be 1-100 letters, digits, '.', '_' or '-'")


def check_slot(slot_id: str, profile: str, secret: bytes, snapshot: EdgeSnapshot) -> bytes:
    """Everything a slot save checks before it writes: the id, the secret (non-empty UTF-8
    text of at most 16 KiB once surrounding whitespace is dropped) and the profile. Returns
    the secret as stored; ``CredentialError`` names what is wrong, never the secret."""
    check_id("slot", slot_id)
    secret = secret.strip()
    if not secret:
        raise CredentialError(f"slot {slot_id!r}: the secret is empty")
    try:
        secret.decode("utf-8")
    except UnicodeDecodeError:
        raise CredentialError(f"slot {slot_id!r}: the secret is not UTF-8 text") from None
    if len(secret) > MAX_SECRET_BYTES:
        raise CredentialError(
            f"slot {slot_id!r}: the secret is larger than {MAX_SECRET_BYTES} bytes (UTF-8)"
        )
    if snapshot.profile_family(profile) is None:
        raise CredentialError(f"slot {slot_id!r}: unknown profile {profile!r}")
    return secret


def set_slot(slot_id: str, profile: str, secret: bytes, keyring: Keyring) -> CredentialSlot:
    """Create or replace a slot's secret; its credential revision goes up by one (R-MGD-2).

    A slot's profile family is fixed once routes use it (R-MGD-6)."""
    check_id("slot", slot_id)
    snapshot = catalog_snapshot()
    secret = check_slot(slot_id, profile, secret, snapshot)
    family = snapshot.profile_family(profile)
    with transaction.atomic():
        slot = CredentialSlot.objects.select_for_update().filter(key=slot_id).first()
        if slot is None:
            slot = CredentialSlot(key=slot_id)
        elif snapshot.profile_family(slot.profile) != family and slot.routes.exists():
            raise CredentialError(
                f"slot {slot_id!r} is used by routes for profile family "
                f"{snapshot.profile_family(slot.profile)!r}; it cannot move to {family!r}"
            )
        slot.profile = profile
        slot.sealed = keyring.seal(secret, slot_id)
        slot.credential_revision = (slot.credential_revision or 0) + 1
        slot.save()
    return slot


def init_keyring(path: str, key_id: str) -> None:
    """A new keyring file with one key, 0600; an existing file is never overwritten."""
    exists = CredentialError(f"{path} exists; use iop_keyring rotate to add a key")
    if Path(path).exists() or Path(path).is_symlink():
        raise exists
    try:
        create_private(path, new_keyring(key_id).dump().encode())
    except (KeyringError, PrivateFileError) as exc:
        raise CredentialError(f"cannot write the keyring {path}: {exc}") from None


def rotate_keyring(path: str, key_id: str) -> int:
    """Add a key (the newest) and re-seal every slot with it in one transaction (R-MGD-2).

    The file is written first, holding every old key too, and replaced whole (R-MGD-8: a
    crash or a full disk leaves the old file or the new one, never a part): if re-sealing
    fails, the slots still open with the key they were sealed under. Returns how many slots
    were re-sealed."""
    keyring = load_keyring(path)
    try:
        rotated = keyring.with_new_key(key_id)
    except KeyringError as exc:
        raise CredentialError(str(exc)) from None
    with transaction.atomic():
        slots = list(CredentialSlot.objects.select_for_update())
        opened = []
        for slot in slots:
            try:
                opened.append((slot, rotated.open(slot.sealed, slot.key)))
            except KeyringError as exc:
                raise CredentialError(f"nothing rotated: {exc}") from None
        try:
            replace_private(path, rotated.dump().encode())
        except PrivateFileError as exc:
            raise CredentialError(f"nothing rotated: {exc}") from None
        for slot, secret in opened:
            slot.sealed = rotated.seal(secret, slot.key)
            slot.save(update_fields=["sealed", "updated_at"])
    return len(slots)


def check_bindings(
    snapshot: EdgeSnapshot, model_group: str, bindings: Mapping[str, str]
) -> dict[str, CredentialSlot]:
    """Each target is a provider of the group or the profile of one; the slot exists and is of
    the target's profile family (R-MGD-6). Returns target -> slot."""
    group = snapshot.models.get(model_group)
    if group is None:
        raise CredentialError(f"unknown model group {model_group!r}")
    if not bindings:
        raise CredentialError("a route needs at least one --slot PROVIDER_OR_PROFILE=SLOT")
    providers = [snapshot.providers[p] for p in group.providers if p in snapshot.providers]
    resolved: dict[str, CredentialSlot] = {}
    for target, slot_id in bindings.items():
        served = [p for p in providers if target in (p.id, p.profile.name)]
        if not served:
            raise CredentialError(
                f"{target!r} is neither a provider of {model_group!r} nor the profile of one"
            )
        slot = CredentialSlot.objects.filter(key=slot_id).first()
        if slot is None:
            raise CredentialError(f"unknown slot {slot_id!r}")
        family = snapshot.profile_family(slot.profile)
        for provider in served:
            if provider.profile.adapter == "cli" and provider.credential_env is None:
                raise CredentialError(  # R-MGD-11: a slot secret never goes in argv
                    f"provider {provider.id!r} is a cli provider without credential_env: "
                    "name the environment variable its slot secret goes in"
                )
            wanted = snapshot.profile_family(provider.profile.name)
            if family != wanted:
                raise CredentialError(
                    f"slot {slot_id!r} is for profile family {family!r}; provider "
                    f"{provider.id!r} uses {wanted!r} (a slot serves one family)"
                )
        resolved[target] = slot
    return resolved


def mint_route_key() -> tuple[str, str]:
    key = ROUTE_KEY_PREFIX + secrets.token_urlsafe(32)
    return key, hashlib.sha256(key.encode("ascii")).hexdigest()


def create_route(
    route_id: str,
    model_group: str,
    bindings: Mapping[str, str],
    *,
    principal_ref: str = "",
) -> str:
    """A new route; returns its raw key, which is stored nowhere (only its sha256)."""
    check_id("route", route_id)
    if principal_ref:
        check_id("principal", principal_ref)
    resolved = check_bindings(catalog_snapshot(), model_group, bindings)
    key, digest = mint_route_key()
    with transaction.atomic():
        if Route.objects.filter(key=route_id).exists():
            raise CredentialError(f"route {route_id!r} exists")
        route = Route.objects.create(
            key=route_id,
            model_group=model_group,
            key_hash_sha256=digest,
            principal_ref=principal_ref,
        )
        RouteSlot.objects.bulk_create(
            RouteSlot(route=route, target=target, slot=slot) for target, slot in resolved.items()
        )
    return key


def rotate_route_key(route_id: str) -> str:
    """A new key for a route: the old one stops working at once, the route revision goes up
    (R-AUTH-5); returns the raw key, stored nowhere (only its sha256)."""
    key, digest = mint_route_key()
    with transaction.atomic():
        route = Route.objects.select_for_update().filter(key=route_id).first()
        if route is None:
            raise CredentialError(f"no route {route_id!r}")
        route.key_hash_sha256 = digest
        route.revision += 1
        route.save(update_fields=["key_hash_sha256", "revision"])
    return key


def parse_bindings(values: list[str]) -> dict[str, str]:
    """``PROVIDER_OR_PROFILE=SLOT`` arguments as a mapping (a target at most once)."""
    out: dict[str, str] = {}
    for value in values:
        target, sep, slot = value.partition("=")
        if not sep or not target or not slot:
            raise CredentialError(f"--slot {value!r}: expected PROVIDER_OR_PROFILE=SLOT")
        if target in out:
            raise CredentialError(f"--slot: {target!r} given twice")
        out[target] = slot
    return out
