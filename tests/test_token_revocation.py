"""Revoking tokens as docs/configuration.md ("Revoking a token") says: a principal token's
removal is live (end to end: tests/test_principal_policy_e2e.py,
test_a_principal_token_removed_live_is_refused_at_once); a node token is checked when the
Node connects, against the running revision, and changes only with a restart."""

from __future__ import annotations

import hashlib

import pytest
from asgiref.sync import sync_to_async

from iop_site.runtime import EdgeRuntime
from refresh import services
from refresh.startup import startup_snapshot
from tests.support.processes import EDGE_YAML

pytestmark = pytest.mark.django_db(transaction=True)

OLD = "foo"  # the shipped example's node-local token (configs/edge.yaml)
NEW = "rotated-node-token-3c9d"


@pytest.fixture
async def edge(transactional_db):
    runtime = EdgeRuntime(await sync_to_async(startup_snapshot)(str(EDGE_YAML)))
    yield runtime
    await runtime.aclose()


async def test_a_node_token_replaced_is_refused_live_and_revoked_at_the_restart(edge):
    assert edge.hub.authenticate("node-local", OLD)
    document = edge.snapshot.document
    node = next(n for n in document["nodes"] if n["id"] == "node-local")
    node["token_hash_sha256"] = hashlib.sha256(NEW.encode()).hexdigest()
    applied = await sync_to_async(services.apply_document)(
        edge, document, source="document", author_label="test"
    )
    assert applied.status == 409
    assert edge.hub.authenticate("node-local", OLD) and not edge.hub.authenticate("node-local", NEW)
    staged = await sync_to_async(services.stage_document)(
        document, source="document", author_label="test"
    )
    assert staged.status == 200
    restarted = EdgeRuntime(await sync_to_async(startup_snapshot)(None))
    try:
        assert restarted.hub.authenticate("node-local", NEW)
        assert not restarted.hub.authenticate("node-local", OLD)
    finally:
        await restarted.aclose()
