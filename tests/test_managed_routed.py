"""Managed runs routed to another Edge (R-SCALE-7, R-MGD-4), in process: the requesting Edge's
slot grant never holds the secret, and the Edge holding the Node issues from it an envelope
bound to the run, its own generation of the Node and the revisions the requester resolved,
which the Node's real half opens (``nodes.agent.credentials``). No database: the plane's
route reader is never called."""

from __future__ import annotations

from pathlib import Path

import pytest

from catalog.config import load_snapshot
from catalog.keyring import Keyring, new_keyring
from nodes import wire
from nodes.agent.config import CredentialPlane
from nodes.agent.credentials import LeaseCredentials, load_opener
from nodes.agent.envelope import EnvelopeRefused
from nodes.envelope import SealRefused
from pool.http.managed import Grant, ManagedKeys, ManagedPlane, SlotUse, routed_sealer
from pool.http.route_table import RouteTable
from secretref.keyfiles import create_private
from tests.support.managed import managed_document, mint_keys
from tests.support.payloads import openai_provider

SECRET = b"sk-routed-canary-5e0b2d"


@pytest.fixture
def edges(tmp_path: Path) -> tuple[ManagedPlane, ManagedPlane, LeaseCredentials, Grant]:
    """Two Edges' planes on one document, a Node (n1) and a route's grant of slot ``s1`` (GLM
    General) for the glm profile; the owner's own table has that route, and one binding slot
    ``s2`` to the provider glm-general-2 (R-MGD-14)."""
    keys = mint_keys(tmp_path / "keys", "n1")
    keyring_file = tmp_path / "keyring.json"
    ring = new_keyring("k1")
    create_private(keyring_file, ring.dump().encode())
    snapshot = load_snapshot(managed_document(keys, keyring_file))
    requester = ManagedPlane(snapshot, ManagedKeys.load(snapshot))
    owner = ManagedPlane(snapshot, ManagedKeys.load(snapshot))
    node = LeaseCredentials(load_opener(CredentialPlane(**keys.node_plane())), "n1")
    keyring = Keyring.load(keyring_file)
    slot = SlotUse("s1", "glm", 4, keyring.seal(SECRET, "s1"))
    grant = Grant("route-a", "team", "glm", 9, {"glm": slot}, keyring)
    other = SlotUse("s2", "glm", 4, keyring.seal(b"sk-other", "s2"))
    second = Grant("route-b", "team", "glm", 2, {"glm-general-2": other}, keyring)
    owner.keys.table = RouteTable("v1", {"a" * 64: grant, "b" * 64: second}, keyring)
    return requester, owner, node, grant


def opened(node: LeaseCredentials, envelope: dict, run_id: str, generation: int) -> bytes:
    provider = openai_provider(
        "http://127.0.0.1:9",
        pid="glm-general",
        auth=wire.AuthPayload(type="header", header="X-Key", scheme=""),
    )
    secret = node.secret(envelope, run_id=run_id, provider=provider, generation=generation)
    assert secret is not None
    return secret.encode()


def test_the_edge_holding_the_node_seals_the_grant_with_its_own_generation_r_scale_7(edges):
    """R-SCALE-7: the grant holds the slot as sealed at rest, never the secret; the owner's
    envelope carries the requester's slot and revisions and the owner's generation, and
    the Node opens it for that run and generation only."""
    requester, owner, node, grant = edges
    slot_grant = requester.slot_grant(grant, "glm-general")
    assert slot_grant is not None
    assert (slot_grant.slot_id, slot_grant.credential_revision, slot_grant.route_revision) == (
        "s1",
        4,
        9,
    )
    assert SECRET not in slot_grant.sealed.encode()
    envelope = routed_sealer(owner, slot_grant, "glm-general")("r-1", "n1", 7)
    binding = {k: envelope[k] for k in ("slot_id", "credential_revision", "route_revision")}
    assert binding == {"slot_id": "s1", "credential_revision": 4, "route_revision": 9}
    assert envelope["generation"] == 7 and envelope["run_id"] == "r-1"
    with pytest.raises(EnvelopeRefused):  # another generation of the Node: refused
        opened(node, envelope, "r-1", 8)
    assert opened(node, routed_sealer(owner, slot_grant, "glm-general")("r-2", "n1", 7), "r-2",
                  7) == SECRET  # fmt: skip


def test_an_edge_that_cannot_seal_a_routed_run_refuses_it_with_the_reason(edges):
    """R-SCALE-7: an owner without managed mode, a Node without a recipient key, or a sealed
    value that does not open: ``SealRefused`` naming the cause, never the secret."""
    requester, owner, _, grant = edges
    slot_grant = requester.slot_grant(grant, "glm-general")
    assert slot_grant is not None
    with pytest.raises(SealRefused, match="not in managed mode"):
        routed_sealer(None, slot_grant, "glm-general")
    with pytest.raises(SealRefused, match="no credential"):
        routed_sealer(owner, slot_grant, "glm-general")("r-1", "n-unknown", 1)
    moved = type(slot_grant)("s2", 4, 9, slot_grant.sealed)  # bound to s1, not s2
    with pytest.raises(SealRefused, match="cannot be unsealed") as refused:
        routed_sealer(owner, moved, "glm-general-2")("r-1", "n1", 1)
    assert SECRET.decode() not in str(refused.value)


@pytest.mark.parametrize(
    ("slot_id", "provider_id"),
    [
        ("s1", "glm-coding"),  # a GLM General slot for the GLM Coding provider
        ("s2", "glm-general"),  # a slot bound to another provider only
        ("s9", "glm-general"),  # a slot no route of this Edge binds
        ("s1", "not-a-provider"),
    ],
)
def test_the_owner_seals_only_a_pair_its_own_enabled_routes_bind_r_mgd_14(
    edges, caplog, slot_id, provider_id
):
    """R-MGD-14: whichever Edge (or Redis writer) asked, a routed order naming a (slot,
    provider) pair that no enabled route of the owner binds within one profile family is
    refused before anything is unsealed, and logged; the owner's table is the only authority."""
    requester, owner, _, grant = edges
    slot_grant = requester.slot_grant(grant, "glm-general")
    assert slot_grant is not None
    forged = type(slot_grant)(slot_id, 4, 9, slot_grant.sealed)
    with pytest.raises(SealRefused, match="not bound to this provider by an enabled route"):
        routed_sealer(owner, forged, provider_id)
    (line,) = [r.getMessage() for r in caplog.records if "R-MGD-14" in r.getMessage()]
    assert line.startswith(f"routed run refused: slot {slot_id} is not bound to provider ")


def test_a_route_binding_a_slot_of_another_family_by_provider_id_is_no_grant_r_mgd_14(edges):
    """R-MGD-14: the pair must be within one profile family even when a route names the
    provider itself (the normal path leaves such a provider out, R-MGD-3)."""
    requester, owner, _, grant = edges
    table = owner.keys.table
    odd = Grant("route-c", "team", "glm", 3, {"glm-coding": grant.slots["glm"]}, table.keyring)
    owner.keys.table = RouteTable("v2", {**table.grants, "c" * 64: odd}, table.keyring)
    slot_grant = requester.slot_grant(grant, "glm-general")
    assert slot_grant is not None
    with pytest.raises(SealRefused):
        routed_sealer(owner, slot_grant, "glm-coding")
    assert routed_sealer(owner, slot_grant, "glm-general")("r-1", "n1", 1)["slot_id"] == "s1"
