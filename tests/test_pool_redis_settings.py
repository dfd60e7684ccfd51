"""``RedisPool`` refuses a bad Edge id, prefix or lease TTL when it is built (R-SCALE-2),
before it touches Redis."""

from __future__ import annotations

import pytest

from pool.engine_redis import RedisPool
from tests.support.pools import prov
from tests.support.redis_pool import policy


@pytest.mark.parametrize(
    ("edge_id", "prefix", "ttl", "why"),
    [
        ("edge a", "iop", 10.0, "Edge id"),
        ("", "iop", 10.0, "Edge id"),
        ("e" * 65, "iop", 10.0, "Edge id"),
        ("edge-a", "", 10.0, "prefix"),
        ("edge-a", "i o p", 10.0, "prefix"),
        ("edge-a", "iop", 0.0, "lease_ttl_s"),
    ],
)
def test_r_scale_2_bad_settings_are_refused_with_the_reason(
    edge_id: str, prefix: str, ttl: float, why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        RedisPool(
            policy(prov("p1")),
            redis_url="redis://127.0.0.1:1/0",
            prefix=prefix,
            edge_id=edge_id,
            lease_ttl_s=ttl,
        )


def test_r_scale_2_a_valid_edge_id_builds_without_connecting() -> None:
    pool = RedisPool(
        policy(prov("p1")), redis_url="redis://127.0.0.1:1/0", prefix="iop", edge_id="host-1.a_b"
    )
    assert pool.idle()
    assert [r.online for r in pool.snapshot().providers] == [False]
