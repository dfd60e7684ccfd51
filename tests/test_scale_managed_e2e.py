"""Managed credential mode with several Edges, end to end (R-SCALE-7, R-MGD-4, R-MGD-14): three real
Edges (runedge over https and wss) on one PostgreSQL database and one Redis, two managed
iop-node Nodes listing every Edge (node-1 on Edge 0, node-2 on Edge 1), a route key used with
the official OpenAI SDK on Edge 2, which holds no Node: every run crosses to the Edge holding
its Node, which issues the lease envelope itself, and only for a (slot, provider) pair its own
routes bind. Keys and certificates are minted in the test.

Runs when ``IOP_TEST_DATABASE_URL`` and ``IOP_TEST_REDIS_URL`` are set."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from catalog.management.commands.iop_keys import write_pair
from tests.support.cluster import Cluster, postgres_test_url, scale_out_marks, scale_out_redis_url
from tests.support.managed import ISSUER_KEY_ID, ManagedKeys, mint_keys
from tests.support.scale_failures import eventually
from tests.support.tls import Pki

DATABASE = postgres_test_url()
pytestmark = scale_out_marks()
SECRET = "sk-scale-canary-7d41c09e5b"  # unique: searched for in every stream entry and log
CAPACITY = 2
NODES = ("node-1", "node-2")
# A GLM Coding Plan provider beside glm-1 on node-1: the route's GLM General slot is not its.
CODER = {"id": "coder-1", "profile": "glm_coding", "base_url": "{up:a}/v1"}


class Managed:
    def __init__(self, cluster: Cluster, pki: Pki) -> None:
        self.cluster, self.pki = cluster, pki
        self.key = ""

    def chat(self, index: int) -> str:
        """A chat completion with the route key through Edge ``index`` over https."""
        with openai.OpenAI(
            base_url=self.cluster.edges[index].openai_url + "/v1",
            api_key=self.key,
            http_client=httpx.Client(verify=ssl.create_default_context(cafile=self.pki.ca_file)),
            max_retries=0,
        ) as client:
            reply = client.chat.completions.create(
                model="glm", messages=[{"role": "user", "content": "hi"}]
            )
        return reply.choices[0].message.content or ""

    def upstream_auth(self, name: str) -> list[str]:
        server = self.cluster.upstream(name).server
        return [r.headers.get("authorization", "") for r in server.requests]


def node(
    keys: ManagedKeys, provider_id: str, upstream: str, pki: Pki, *extra: dict[str, Any]
) -> dict[str, Any]:
    base_url = f"{{up:{upstream}}}/v1"
    return {
        "id": keys.node_id,
        "providers": [
            {"id": provider_id, "profile": "glm", "base_url": base_url, "capacity": CAPACITY},
            *extra,
        ],
        "config": {"tls": {"ca_file": str(pki.ca_file)}, "credential_plane": keys.node_plane()},
        "recipient": {"key_id": f"{keys.node_id}-recipient", "public_key_file": str(keys.node_pub)},
    }


@pytest.fixture(scope="module")
def managed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Managed]:
    directory = tmp_path_factory.mktemp("scale-managed")
    pki = Pki(directory / "pki")
    keys_1 = mint_keys(directory / "keys", NODES[0])  # the issuer pair, node-1's pair
    write_pair(directory / "keys", NODES[1], X25519PrivateKey.generate())
    keys_2 = ManagedKeys(directory / "keys", NODES[1])
    keyring = directory / "keyring.json"
    tls = {"cert_file": str(pki.edge.cert), "key_file": str(pki.edge.key)}
    cluster = Cluster(
        directory / "cluster",
        database_url=DATABASE,
        edges=3,
        redis_url=scale_out_redis_url(),
        database_prefix="iop_scale_managed",
        upstreams={"a": "openai", "b": "openai"},
        edge={"tls": tls},
        openai={"tls": tls, "principal_tokens": []},
        credential_plane={
            "enabled": True,
            "issuer": {"key_id": ISSUER_KEY_ID, "private_key_file": str(keys_1.issuer_key)},
            "keyring_file": str(keyring),
        },
        nodes=[node(keys_1, "glm-1", "a", pki, CODER), node(keys_2, "glm-2", "b", pki)],
        models=[
            {"id": "glm", "providers": {"glm-1": "glm-4.6", "glm-2": "glm-4.6"}},
            {"id": "coder", "providers": {"coder-1": "glm-4.6"}},  # no route binds it a slot
        ],
        log_level="DEBUG",  # the canary must not show up even at the most verbose level
    )
    cluster.manage("iop_keyring", "init", str(keyring), "--key-id", "k1")
    with cluster:
        env = Managed(cluster, pki)
        cluster.manage("iop_slot", "set", "glm-main", "--profile", "glm", stdin=SECRET.encode())
        out = cluster.manage(
            "iop_route", "create", "team-a", "--model", "glm", "--slot", "glm=glm-main", "--json"
        )
        env.key = json.loads(out)["key"]
        yield env


def stream_entries(cluster: Cluster) -> list[bytes]:
    """Every field value of every run-routing stream entry under the cluster's prefix."""
    client = redis.Redis.from_url(str(cluster.redis_url))
    try:
        values = []
        for key in client.scan_iter(match=f"{cluster.redis_prefix}:edge:*", count=1000):
            for _, fields in client.xrange(key):
                values.extend(fields.values())
        return values
    finally:
        client.close()


def test_a_managed_request_on_an_edge_without_the_node_is_served_with_the_slot_secret_r_scale_7(
    managed: Managed,
):
    """R-SCALE-7, R-MGD-4: eight calls with the route key on Edge 2, which holds neither Node;
    each run is routed to Edge 0 or 1, which seals the slot secret to its own Node (that
    Node's recipient key, its connection generation) and the Node opens it: both upstreams
    get exactly the slot secret, never more at once than their capacity. The routed orders in
    Redis carry the slot as sealed at rest and never the secret itself."""
    cluster = managed.cluster
    assert [cluster.edge_of(n) for n in NODES] == [0, 1]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: managed.chat(2), range(8)))
    assert all(answers), answers
    auth = managed.upstream_auth("a") + managed.upstream_auth("b")
    assert auth == [f"Bearer {SECRET}"] * 8
    assert managed.upstream_auth("a") and managed.upstream_auth("b")  # both Nodes served
    assert all(cluster.upstream(n).server.peak <= CAPACITY for n in ("a", "b"))
    entries = stream_entries(cluster)
    orders = [json.loads(v) for v in entries if b'"t":"open"' in v]
    assert len(orders) >= 8 and all(o["grant"]["slot_id"] == "glm-main" for o in orders)
    assert all(o["grant"]["sealed"].startswith("v1:k1:") for o in orders)
    assert not [v for v in entries if SECRET.encode() in v]


def test_a_managed_request_on_the_edge_holding_the_node_is_sealed_locally_r_mgd_4(
    managed: Managed,
):
    """R-MGD-4 unchanged with several Edges: on an Edge that holds a Node, a run on that Node
    is sealed where it is; the secret reaches the upstream and no log line holds it."""
    managed.cluster.reset_upstreams()
    for index in (0, 1):
        assert managed.chat(index)
    auth = managed.upstream_auth("a") + managed.upstream_auth("b")
    assert auth == [f"Bearer {SECRET}"] * 2
    for path in Path(managed.cluster.dir).glob("*.log"):
        assert SECRET not in path.read_text(errors="replace"), path.name


def test_a_routed_order_naming_a_pair_no_route_binds_is_refused_and_logged_r_mgd_14(
    managed: Managed,
):
    """R-MGD-14: a routed order copied from Redis with its provider changed to the GLM Coding
    Plan provider (the route binds its GLM General slot to the glm profile only) reaches
    Edge 0, which holds node-1: it ends credential_refused before anything is unsealed, the
    refusal is in Edge 0's log, and the upstream never sees the run or the secret."""
    cluster = managed.cluster
    client = redis.Redis.from_url(str(cluster.redis_url))

    def messages(key: bytes | str) -> list[dict[str, Any]]:
        return [json.loads(fields[b"m"]) for _, fields in client.xrange(key)]

    def orders() -> list[tuple[bytes, dict[str, Any]]]:
        keys = client.keys(f"{cluster.redis_prefix}:edge:edge-0:*:runs")
        return [(key, m) for key in keys for m in messages(key) if m["t"] == "open"]

    try:
        for _ in range(32):  # a routed order from Edge 2 to Edge 0 (node-1) to copy
            if orders():
                break
            assert managed.chat(2)
        runs, order = orders()[-1]
        cluster.reset_upstreams()
        forged = {**order, "run_id": "forged-r-mgd-14", "provider_id": "coder-1"}
        assert forged["node_id"] == "node-1" and forged["grant"]["slot_id"] == "glm-main"
        client.xadd(runs, {"m": json.dumps(forged)})
        replies = f"{cluster.redis_prefix}:edge:{forged['reply_to']}:{forged['fence']}:replies"

        def ends() -> list[dict[str, Any]]:
            return [
                m for m in messages(replies) if m["run_id"] == forged["run_id"] and m["t"] == "end"
            ]

        eventually(lambda: bool(ends()), "the forged run's end", state=cluster.logs)
        (end,) = ends()
    finally:
        client.close()
    assert end["ok"] is False and end["error"]["code"] == "credential_refused"
    log = (Path(cluster.dir) / "edge-0.log").read_text()
    assert "routed run refused: slot glm-main is not bound to provider coder-1" in log
    assert managed.upstream_auth("a") == []
