"""The scale-out start checks ask once (R-SCALE-9, R-HA-1; docs/scale-out.md "Start
refusals"): a Redis or a sentinel that refuses the connection is refused after one attempt,
so the refusal comes within the check's stated bound. redis-py's default retries a failed
connection three times with a growing backoff (about 5 s for a refused port, four times the
timeout for a silent one); these tests count the connection attempts."""

from __future__ import annotations

import pytest
import redis.connection

from iop_site.scale import ScaleOutRefused, ScaleSettings, check_redis
from tests.support.ports import free_port


@pytest.fixture
def attempts(monkeypatch) -> list[tuple[str, int]]:
    """Every connection redis-py opens, (host, port), in order."""
    seen: list[tuple[str, int]] = []
    connect = redis.connection.Connection._connect

    def counted(self: redis.connection.Connection) -> object:
        seen.append((self.host, self.port))
        return connect(self)

    monkeypatch.setattr(redis.connection.Connection, "_connect", counted)
    return seen


def test_a_redis_that_refuses_the_connection_is_asked_once(attempts):
    port = free_port()
    with pytest.raises(ScaleOutRefused, match=r"does not answer \(connection refused\)"):
        check_redis(ScaleSettings(redis_url=f"redis://127.0.0.1:{port}/0"))
    assert attempts == [("127.0.0.1", port)]


def test_each_sentinel_that_refuses_the_connection_is_asked_once(attempts):
    first, second = free_port(), free_port()
    url = f"redis+sentinel://127.0.0.1:{first},127.0.0.1:{second}/iop-test/0"
    with pytest.raises(ScaleOutRefused, match="no sentinel named in IOP_REDIS_URL answers"):
        check_redis(ScaleSettings(redis_url=url))
    assert attempts == [("127.0.0.1", first), ("127.0.0.1", second)]
