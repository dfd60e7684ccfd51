"""Principal token policy keys at load: scope, limits, queue share (R-PRIN-1..3)."""

from __future__ import annotations

import pytest

from catalog.config import load_snapshot
from tests.support.config import load_issues
from tests.support.config_examples import example_document

HASH_A = "a" * 64


def _with_token(**policy) -> dict:
    document = example_document()
    document["openai"]["principal_tokens"] = [
        {"token_ref": "app-a", "token_hash_sha256": HASH_A, "principal_ref": "team", **policy}
    ]
    return document


def test_the_policy_keys_load_into_the_snapshot_and_the_canonical_document():
    """R-PRIN-1..3: models, max_in_flight, rpm, tpm and max_queued are all optional."""
    models = [m["id"] for m in example_document()["models"]][:1]
    document = _with_token(models=models, max_in_flight=2, rpm=60, tpm=5000, max_queued=3)
    snapshot = load_snapshot(document)
    (token,) = snapshot.principal_tokens
    assert token.models == frozenset(models)
    assert (token.max_in_flight, token.rpm, token.tpm, token.max_queued) == (2, 60, 5000, 3)
    entry = snapshot.document["openai"]["principal_tokens"][0]
    assert entry["models"] == models and entry["max_queued"] == 3


def test_omitted_policy_keys_mean_every_model_and_no_limit():
    """R-PRIN-1, R-PRIN-2: omitted = every group, no limit."""
    (token,) = load_snapshot(_with_token()).principal_tokens
    assert token.models is None
    assert (token.max_in_flight, token.rpm, token.tpm, token.max_queued) == (None,) * 4
    entry = load_snapshot(_with_token()).document["openai"]["principal_tokens"][0]
    assert "models" not in entry and "rpm" not in entry


def test_an_unknown_model_id_in_models_is_a_load_error_naming_its_path():
    """R-PRIN-1: a scope names configured model groups only."""
    issues = load_issues(_with_token(models=["no-such-group"]))
    assert issues == ["openai.principal_tokens[0].models[0]: unknown model group 'no-such-group'"]


@pytest.mark.parametrize("key", ["max_in_flight", "rpm", "tpm", "max_queued"])
@pytest.mark.parametrize("value", [0, -1])
def test_a_zero_or_negative_limit_is_a_load_error_naming_its_path(key, value):
    """R-PRIN-2, R-PRIN-3: a limit is at least 1; omit it for none."""
    issues = load_issues(_with_token(**{key: value}))
    assert len(issues) == 1
    assert issues[0].startswith(f"openai.principal_tokens[0].{key}: ")


def test_an_empty_models_list_is_refused():
    """R-PRIN-1: omit ``models`` for every group; an empty list is refused, not guessed."""
    issues = load_issues(_with_token(models=[]))
    assert len(issues) == 1 and issues[0].startswith("openai.principal_tokens[0].models: ")


def test_max_queued_above_the_root_queue_is_a_load_error_naming_its_path():
    """R-PRIN-3: a token's share can not exceed the one queue (max_queue, default 16)."""
    document = _with_token(max_queued=9)
    document["provider_pool"] = {"max_queue": 8}
    assert load_issues(document) == [
        "openai.principal_tokens[0].max_queued: must not exceed provider_pool.max_queue (8)"
    ]
    document["provider_pool"] = {"max_queue": 9}
    load_snapshot(document)
