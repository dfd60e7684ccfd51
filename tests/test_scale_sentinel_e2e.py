"""Scale-out through Redis Sentinel, end to end (R-HA-1, R-HA-2): two real Edges (runedge)
given ``IOP_REDIS_URL=redis+sentinel://...`` on one PostgreSQL database, two iop-node Nodes,
fake upstreams whose ``peak`` gauge shows what they served at once; a primary, a replica and
three sentinels of the module's own on free loopback ports. The primary is killed under load:
Sentinel promotes the replica, every Edge follows it by itself, capacity is never exceeded
and the leases return to zero. Times printed as ``measured:`` feed docs/scale-out.md."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.support.cluster import Cluster, postgres_test_url, scale_out_marks
from tests.support.journeys import journey_blocks
from tests.support.processes import ROOT
from tests.support.scale_failures import Load, eventually, read_pool
from tests.support.sentinel import (
    DOWN_AFTER_MS,
    SERVICE,
    SentinelDeployment,
    sentinel_deployment,
)

pytestmark = [
    *scale_out_marks(),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]
TTL_S = 2.0
CAPACITY = {"a": 2, "b": 2}
NODES = [
    {
        "id": f"node-{up}",
        "providers": [{"id": f"p-{up}", "profile": "openai", "base_url": f"{{up:{up}}}/v1",
                       "capacity": cap}],
    }
    for up, cap in CAPACITY.items()
]  # fmt: skip
MODELS = [{"id": "gpt-test", "providers": {"p-a": "served-gpt", "p-b": "served-gpt"}}]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelDeployment]:
    with sentinel_deployment(tmp_path_factory.mktemp("sentinel")) as started:
        yield started


def page_url(deployment: SentinelDeployment) -> str:
    """``IOP_REDIS_URL`` as docs/scale-out.md's ``scale-sentinel`` block sets it, for the
    test's sentinels and service."""
    command = journey_blocks(ROOT / "docs" / "scale-out.md")["scale-sentinel"]
    for i, sentinel in enumerate(deployment.sentinels, start=1):
        command = command.replace(f"sentinel-{i}.internal:26379", f"127.0.0.1:{sentinel.port}")
    command = command.replace("/iop/0", f"/{SERVICE}/0")
    shell = subprocess.run(
        ["bash", "-c", f'{command}\nprintf %s "$IOP_REDIS_URL"'],
        check=True,
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert shell.stdout == deployment.url, shell.stdout
    return shell.stdout


@pytest.fixture(scope="module")
def cluster(
    deployment: SentinelDeployment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with Cluster(
        tmp_path_factory.mktemp("cluster"),
        database_url=postgres_test_url(),
        edges=2,
        redis_url=page_url(deployment),
        database_prefix="iop_scale_sentinel",
        lease_ttl_s=TTL_S,
        upstreams={name: "openai" for name in CAPACITY},
        nodes=NODES,
        models=MODELS,
        pool={"max_queue": 100},
    ) as started:
        assert started.chat(0)[0] == 200  # past the fresh prefix's recovery grace
        yield started


def test_the_primary_killed_under_load_every_edge_follows_the_promoted_replica_r_ha_1(
    cluster: Cluster, deployment: SentinelDeployment
) -> None:
    for name in CAPACITY:
        cluster.upstream(name).server.faults.stall_before_first_byte = 0.05
    with Load(cluster, edges=2) as load:
        results = load.results
        eventually(lambda: sum(r[3] == 200 for r in results) >= 12, "load running")
        assert deployment.primary_ports() == {deployment.primary.port}
        killed = time.monotonic()
        deployment.primary.kill()
        promoted = deployment.wait_promoted(deployment.replica.port)
        print(
            f"measured: Sentinel promoted the replica {promoted * 1000:.0f} ms after the "
            f"kill (down-after {DOWN_AFTER_MS} ms)"
        )
        for index in range(2):
            eventually(
                lambda index=index: any(
                    r[0] > killed + promoted and r[2] == index and r[3] == 200 for r in results
                ),
                f"edge-{index} answering 200 through the promoted replica",
            )
        back = time.monotonic() - killed
        print(
            f"measured: primary killed -> every Edge answers 200 again: {back * 1000:.0f} ms "
            f"(lease TTL {TTL_S} s)"
        )
        eventually(lambda: sum(r[0] > killed + back for r in results) >= 12, "load after")
    failed = {(r[3], r[4]) for r in results if r[3] != 200}
    assert failed <= {(503, "pool_unavailable"), (503, "pool_recovering")}, failed
    assert all(r[3] != 0 for r in results)  # none hung until the client gave up
    after = [r for r in results if r[0] > killed + back]
    assert after and all(r[3] == 200 for r in after), after
    for name in CAPACITY:  # R-HA-2: never above capacity across the failover
        assert cluster.upstream(name).server.peak <= CAPACITY[name]
    eventually(lambda: read_pool(cluster).idle(), "leases back to zero on the new primary",
               state=lambda: read_pool(cluster))  # fmt: skip
    logs = cluster.logs()
    assert "a new epoch begins (R-HA-2)" in logs, logs[-4000:]
