"""Root queue policy and long-context threshold (R-CFG-6, R-CFG-7)."""

from __future__ import annotations

import pytest

from catalog.config import load_snapshot
from tests.support.config import load_issues
from tests.support.config_examples import example_document


def _providers(document) -> list[dict]:
    return document["nodes"][0]["providers"]


def test_threshold_example_value_and_default_is_100000_r_cfg_6():
    """R-CFG-6: the example value 100000 is also the default."""
    document = example_document()
    del document["openai"]["long_context_threshold_tokens"]
    assert load_snapshot(document).long_context_threshold_tokens == 100000


@pytest.mark.parametrize("value", [0, -1])
def test_threshold_at_or_below_zero_is_rejected_r_cfg_6(value):
    """R-CFG-6: a threshold <= 0 is a load error."""
    document = example_document()
    document["openai"]["long_context_threshold_tokens"] = value
    assert load_issues(document) == ["openai.long_context_threshold_tokens: must be > 0"]


def test_threshold_is_exposed_r_cfg_6():
    document = example_document()
    document["openai"]["long_context_threshold_tokens"] = 50000
    assert load_snapshot(document).long_context_threshold_tokens == 50000


@pytest.mark.parametrize("pool", [None, {}, {"max_queue": 0}, {"max_queue": None}])
def test_max_queue_zero_or_omitted_means_16_r_cfg_7(pool):
    """R-CFG-7: provider_pool.max_queue 0 or omitted -> 16."""
    document = example_document()
    if pool is None:
        del document["provider_pool"]
    else:
        document["provider_pool"] = pool
    snapshot = load_snapshot(document)
    assert snapshot.max_queue == 16
    assert snapshot.document["provider_pool"]["max_queue"] == 16


def test_queue_timeout_omitted_means_30000_and_explicit_zero_means_none_r_cfg_7():
    """R-CFG-7: queue_timeout_ms omitted -> 30000; explicit 0 stays 0 (no timeout)."""
    document = example_document()
    document["provider_pool"] = {"max_queue": 3}
    assert load_snapshot(document).queue_timeout_ms == 30000
    document["provider_pool"]["queue_timeout_ms"] = 0
    snapshot = load_snapshot(document)
    assert (snapshot.max_queue, snapshot.queue_timeout_ms) == (3, 0)
    assert snapshot.document["provider_pool"] == {"max_queue": 3, "queue_timeout_ms": 0}


@pytest.mark.parametrize("key", ["max_queue", "queue_timeout_ms"])
def test_negative_queue_values_are_rejected_r_cfg_7(key):
    """R-CFG-7: queue values are >= 0."""
    document = example_document()
    document["provider_pool"][key] = -1
    assert load_issues(document) == [f"provider_pool.{key}: must be >= 0"]


def test_agreeing_legacy_provider_keys_are_promoted_to_the_root_r_cfg_7():
    """R-CFG-7: with no root keys, equal legacy values move to provider_pool only."""
    document = example_document()
    del document["provider_pool"]
    for provider in _providers(document)[:2]:
        provider["max_queue"] = 5
        provider["queue_timeout_ms"] = 0
    snapshot = load_snapshot(document)
    assert (snapshot.max_queue, snapshot.queue_timeout_ms) == (5, 0)
    canonical = snapshot.document
    assert canonical["provider_pool"] == {"max_queue": 5, "queue_timeout_ms": 0}
    for provider in canonical["nodes"][0]["providers"]:
        assert "max_queue" not in provider and "queue_timeout_ms" not in provider
    assert load_snapshot(canonical) == snapshot


def test_differing_legacy_values_reject_the_load_r_cfg_7():
    """R-CFG-7: legacy values that disagree are a load error at the root key."""
    document = example_document()
    del document["provider_pool"]
    _providers(document)[0]["max_queue"] = 4
    _providers(document)[1]["max_queue"] = 8
    _providers(document)[0]["queue_timeout_ms"] = 1000
    _providers(document)[2]["queue_timeout_ms"] = 2000
    assert load_issues(document) == [
        "provider_pool.max_queue: legacy per-provider max_queue values differ "
        "(nodes[0].providers[0]=4, nodes[0].providers[1]=8); set provider_pool.max_queue",
        "provider_pool.queue_timeout_ms: legacy per-provider queue_timeout_ms values differ "
        "(nodes[0].providers[0]=1000, nodes[0].providers[2]=2000); "
        "set provider_pool.queue_timeout_ms",
    ]


def test_root_keys_win_over_legacy_keys_which_are_dropped_r_cfg_7():
    """R-CFG-7: legacy keys are promoted only when the root key is absent."""
    document = example_document()
    document["provider_pool"] = {"max_queue": 7, "queue_timeout_ms": 100}
    _providers(document)[0]["max_queue"] = 4
    _providers(document)[1]["max_queue"] = 8
    _providers(document)[0]["queue_timeout_ms"] = 5
    snapshot = load_snapshot(document)
    assert (snapshot.max_queue, snapshot.queue_timeout_ms) == (7, 100)
    assert all("max_queue" not in p for p in snapshot.document["nodes"][0]["providers"])


def test_legacy_promotion_is_per_key_r_cfg_7():
    """R-CFG-7: a root max_queue and a legacy queue_timeout_ms combine."""
    document = example_document()
    document["provider_pool"] = {"max_queue": 9}
    _providers(document)[2]["queue_timeout_ms"] = 1500
    snapshot = load_snapshot(document)
    assert (snapshot.max_queue, snapshot.queue_timeout_ms) == (9, 1500)


def test_legacy_max_queue_zero_counts_as_unset_r_cfg_7():
    """R-CFG-7: a legacy 0 means "default" like the root key, so it does not conflict."""
    document = example_document()
    del document["provider_pool"]
    _providers(document)[0]["max_queue"] = 0
    _providers(document)[1]["max_queue"] = 6
    assert load_snapshot(document).max_queue == 6
