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
from secretref.keyfiles import create_private
from tests.support.managed import managed_document, mint_keys
from tests.support.payloads import openai_provider

SECRET = b"sk-routed-canary-5e0b2d"


@pytest.fixture
def edges(tmp_path: Path) -> tuple[ManagedPlane, ManagedPlane, LeaseCredentials, Grant]:
    """Two Edges' planes on one document, a Node (n1) and a route's grant of slot ``s1``."""
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
        routed_sealer(owner, moved, "glm-general")("r-1", "n1", 1)
    assert SECRET.decode() not in str(refused.value)
