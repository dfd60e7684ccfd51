"""Several Edges on a Redis that speaks TLS only (docs/scale-out.md, "Redis over TLS"): a
redis-server of the test's own with certificates minted in the test, two Edges given
``IOP_REDIS_URL=rediss://...?ssl_ca_certs=CA`` on one PostgreSQL database. Routed runs and
forwarded headers cross Redis streams, so they travel encrypted; an Edge that does not trust
the server's certificate does not start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import DATABASE, Cluster, needs_postgres
from tests.support.redis_pool import OwnRedis, RedisStartError
from tests.support.tls import Pki

pytestmark = [pytest.mark.slow, needs_postgres]


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OwnRedis, Pki]]:
    directory = tmp_path_factory.mktemp("rediss")
    pki = Pki(directory / "pki")
    server = OwnRedis(directory, (pki.edge.cert, pki.edge.key, pki.ca_file))
    try:
        server.start()
    except RedisStartError as exc:
        pytest.skip(f"this redis-server cannot listen for TLS: {str(exc)[-300:]}")
    except FileNotFoundError:
        pytest.skip("redis-server is not installed")
    try:
        yield server, pki
    finally:
        server.kill()


def test_two_edges_route_runs_over_a_tls_only_redis(
    tls_redis: tuple[OwnRedis, Pki], tmp_path: Path
) -> None:
    """rediss:// with the CA as ``ssl_ca_certs``: both Edges start in scale-out mode and a
    request through the Edge without the Node is routed to it over the TLS Redis."""
    server, _ = tls_redis
    with Cluster(tmp_path, database_url=DATABASE, edges=2, redis_url=server.url) as cluster:
        assert cluster.edge_of("node-1") == 0
        for index in (0, 1):  # Edge 1 has no Node: its run crosses Redis streams
            status, body = cluster.chat(index)
            assert status == 200 and body["choices"], body


def test_an_edge_that_does_not_trust_the_redis_certificate_does_not_start(
    tls_redis: tuple[OwnRedis, Pki], tmp_path: Path
) -> None:
    """rediss:// without the CA: the certificate does not verify and the Edge stops at start
    with one line, never a traceback (R-SCALE-9)."""
    server, _ = tls_redis
    untrusted = server.url.split("?", 1)[0]
    cluster = Cluster(  # the cluster's own cleanup trusts the CA; the Edge is not told it
        tmp_path,
        database_url=DATABASE,
        edges=1,
        redis_url=server.url,
        env={"IOP_REDIS_URL": untrusted},
    )
    with pytest.raises(RuntimeError, match="exited at start") as refused:
        cluster.start(wait_online=False)
    log = str(refused.value)
    assert "certificate verify failed" in log, log[-2000:]
    assert "IOP Edge ready" not in log and "Traceback" not in log
