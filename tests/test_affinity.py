"""Cache affinity in process (R-AFF-1): the remembered provider wins only among free slots,
the map stays within its bound under a flood of keys, keys are digests (never a client's
text), and an ejected, disabled or removed provider simply stops winning."""

from __future__ import annotations

import pytest

from catalog.config import Affinity
from pool.engine import PoolPolicy
from pool.engine.affinity import MAX_KEYS, AffinityMap
from pool.http.affinity import PREFIX_BYTES, affinity_of
from tests.support.clock import Clock
from tests.support.pools import prov, ready_pool

KEY = ("conv", 60.0)


async def test_the_last_provider_of_a_key_wins_while_it_has_a_free_slot() -> None:
    clock = Clock()
    pool = ready_pool(prov("a", cap=2), prov("b", cap=2), clock=clock)
    first = await pool.acquire("m", affinity=KEY)
    # the pool's own rule would now pick the other, idle provider; affinity keeps the key's
    again = await pool.acquire("m", affinity=KEY)
    assert again.provider_id == first.provider_id
    # full now: the pool's rule decides, capacity is never exceeded
    third = await pool.acquire("m", affinity=KEY)
    assert third.provider_id != first.provider_id
    hits, misses = pool.affinity_counts
    assert (hits["m"], misses["m"]) == (1, 2)  # the first had no entry, the third no room
    for lease in (first, again, third):
        pool.release(lease)
    # the third one ran on the other provider: the key now follows it
    assert (await pool.acquire("m", affinity=KEY)).provider_id == third.provider_id


async def test_an_entry_expires_after_its_ttl() -> None:
    clock = Clock()
    pool = ready_pool(prov("a", cap=4), prov("b", cap=4), clock=clock)
    held = await pool.acquire("m", affinity=("conv", 5.0))
    clock.now += 5.0
    other = await pool.acquire("m", affinity=("conv", 5.0))
    assert other.provider_id != held.provider_id  # expired: the least loaded one


async def test_a_disabled_or_removed_provider_stops_winning() -> None:
    pool = ready_pool(prov("a", cap=4), prov("b", cap=4))
    lease = await pool.acquire("m", affinity=KEY)
    pool.release(lease)
    kept = prov("b" if lease.provider_id == "a" else "a", cap=4)
    pool.apply(PoolPolicy((kept,), {"m": (kept.provider_id,)}, 16, 0))
    assert (await pool.acquire("m", affinity=KEY)).provider_id == kept.provider_id


def test_a_flood_of_distinct_keys_stays_within_the_bound() -> None:
    """100 000 keys: the map holds the most recent MAX_KEYS, memory does not grow past it."""
    affinity = AffinityMap()
    for i in range(100_000):
        affinity.remember(f"k{i}", "a", 1e9)
    assert len(affinity) == MAX_KEYS
    assert affinity.lookup("k0", 0.0) is None and affinity.lookup("k99999", 0.0) == "a"


@pytest.mark.parametrize(
    ("kind", "body", "same_as"),
    [
        (
            "prompt_cache_key",
            {"prompt_cache_key": "x" * 10_000},
            {"prompt_cache_key": "x" * 10_000},
        ),
        ("user", {"metadata": {"user_id": "u-1"}}, {"user": "u-1"}),
        (
            "prefix",
            {"system": "s", "messages": [{"role": "user", "content": "hi"}]},
            {
                "system": "s",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello"},
                    {"role": "user", "content": "more"},
                ],
            },
        ),
    ],
)
def test_a_key_is_a_digest_of_the_group_and_the_field(
    kind: str, body: dict[str, object], same_as: dict[str, object]
) -> None:
    spec = Affinity(kind, 30)
    key, ttl = affinity_of("g", spec, body) or ("", 0.0)
    assert len(key) == 32 and ttl == 30.0  # a long key is hashed, never kept raw
    assert affinity_of("g", spec, same_as) == (key, 30.0)  # the next turn keys the same
    assert affinity_of("other", spec, same_as) != (key, 30.0)  # keys are per group


def test_no_key_or_no_affinity_is_the_pool_s_own_rule() -> None:
    assert affinity_of("g", None, {"prompt_cache_key": "k"}) is None
    assert affinity_of("g", Affinity("prompt_cache_key", 30), {"user": "u"}) is None
    assert affinity_of("g", Affinity("user", 30), {"user": {"id": 1}}) is None
    assert affinity_of("g", Affinity("prefix", 30), {"messages": []}) is None
    long_head = {"messages": [{"role": "user", "content": "x" * (2 * PREFIX_BYTES)}]}
    longer = {"messages": [{"role": "user", "content": "x" * (3 * PREFIX_BYTES)}]}
    assert affinity_of("g", Affinity("prefix", 30), long_head) == affinity_of(
        "g", Affinity("prefix", 30), longer
    )  # only the head's first PREFIX_BYTES count
