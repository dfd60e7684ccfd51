"""Lease envelopes: sealed to one Node, signed by the issuer, bound to one run.

R-MGD-4, R-AUTH-4.
"""

from __future__ import annotations

import dataclasses

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from nodes.agent.envelope import CLOCK_SKEW_S, EnvelopeOpener, EnvelopeRefused
from nodes.envelope import Binding, EphemeralKeys, b64, issue, unb64
from tests.support.clock import Clock

SECRET = b"sk-canary-7f3a9c"
NOW = 1_800_000_000.0
BINDING = Binding("r1", "node-a", "glm-general", "glm-slot", 3, 2, 5)


@pytest.fixture
def keys():
    return {"issuer": Ed25519PrivateKey.generate(), "recipient": X25519PrivateKey.generate()}


def make(keys, binding=BINDING, now=NOW, ttl_s=60, issuer_key_id="iss-1", secret=SECRET):
    return issue(
        secret,
        binding,
        recipient_key_id="node-a-1",
        recipient=keys["recipient"].public_key(),
        issuer_key_id=issuer_key_id,
        issuer=keys["issuer"],
        now=now,
        ttl_s=ttl_s,
    )


def opener(keys, size=8, issuer=None, monotonic=None):
    return EnvelopeOpener(
        recipient_key_id="node-a-1",
        recipient=keys["recipient"],
        issuers={"iss-1": (issuer or keys["issuer"]).public_key()},
        replay_cache_size=size,
        monotonic=monotonic or Clock(),
    )


def open_(node: EnvelopeOpener, envelope, binding: Binding, now: float) -> bytes:
    """Open as the Node does: against the run it received, on this Node and connection."""
    return node.open(
        envelope,
        run_id=binding.run_id,
        node_id=binding.node_id,
        provider_id=binding.provider_id,
        generation=binding.generation,
        now=now,
    )


def refused(fn, reason: str) -> str:
    with pytest.raises(EnvelopeRefused) as info:
        fn()
    assert info.value.reason == reason
    assert SECRET.decode() not in str(info.value)
    return str(info.value)


def test_the_bound_node_opens_the_secret_once(keys) -> None:
    envelope = make(keys)
    node = opener(keys)
    assert open_(node, envelope, BINDING, NOW + 1) == SECRET
    refused(lambda: open_(node, envelope, BINDING, NOW + 2), "replayed")


def test_the_secret_is_not_readable_in_the_envelope(keys) -> None:
    envelope = make(keys)
    assert SECRET not in repr(envelope).encode()
    assert SECRET not in unb64(envelope["ct"])


@pytest.mark.parametrize(
    "field, value",
    [
        ("run_id", "r2"),
        ("node_id", "node-b"),
        ("provider_id", "glm-coding"),
        ("generation", 6),
    ],
)
def test_an_envelope_for_another_run_node_provider_or_generation_is_refused(
    keys, field, value
) -> None:
    other = dataclasses.replace(BINDING, **{field: value})
    message = refused(lambda: open_(opener(keys), make(keys), other, NOW), "wrong_binding")
    assert field in message


def test_an_expired_envelope_is_refused_after_the_clock_skew(keys) -> None:
    envelope = make(keys, ttl_s=60)
    assert open_(opener(keys), envelope, BINDING, NOW + 60 + CLOCK_SKEW_S) == SECRET
    refused(lambda: open_(opener(keys), envelope, BINDING, NOW + 61 + CLOCK_SKEW_S), "expired")


def test_a_wrong_issuer_key_is_refused(keys) -> None:
    forged = make({**keys, "issuer": Ed25519PrivateKey.generate()})
    refused(lambda: open_(opener(keys), forged, BINDING, NOW), "bad_signature")
    unknown = make(keys, issuer_key_id="iss-9")
    refused(lambda: open_(opener(keys), unknown, BINDING, NOW), "unknown_issuer")


@pytest.mark.parametrize(
    "field",
    [
        "ct",
        "nonce",
        "epk",
        "run_id",
        "expires_at",
        "slot_id",
        "credential_revision",
        "route_revision",
    ],
)
def test_a_tampered_envelope_is_refused(keys, field) -> None:
    envelope = make(keys)
    if field in ("ct", "nonce", "epk"):
        raw = bytearray(unb64(envelope[field]))
        raw[0] ^= 1
        envelope[field] = b64(bytes(raw))
    elif field in ("run_id", "slot_id"):
        envelope[field] = "other"
    else:
        envelope[field] += 3600  # a later expiry, another credential or route revision
    refused(lambda: open_(opener(keys), envelope, BINDING, NOW), "bad_signature")


def test_an_envelope_sealed_to_another_node_does_not_open(keys) -> None:
    other = {**keys, "recipient": X25519PrivateKey.generate()}
    envelope = make(other)  # right issuer, right key id, another Node's public key
    refused(lambda: open_(opener(keys), envelope, BINDING, NOW), "does_not_open")


def test_malformed_envelopes_are_refused(keys) -> None:
    refused(lambda: open_(opener(keys), "nope", BINDING, NOW), "malformed")
    refused(lambda: open_(opener(keys), {**make(keys), "v": 9}, BINDING, NOW), "malformed")
    refused(lambda: open_(opener(keys), {**make(keys), "sig": 5}, BINDING, NOW), "bad_signature")
    odd_issuer = {**make(keys), "issuer": ["iss-1"]}  # not a string: no lookup, no crash
    refused(lambda: open_(opener(keys), odd_issuer, BINDING, NOW), "unknown_issuer")


def test_the_replay_cache_is_bounded_and_forgets_only_expired_ids(keys) -> None:
    mono = Clock()
    node = opener(keys, size=2, monotonic=mono)
    runs = [dataclasses.replace(BINDING, run_id=f"r{i}") for i in range(3)]
    open_(node, make(keys, runs[0]), runs[0], NOW)
    open_(node, make(keys, runs[1]), runs[1], NOW)
    refused(lambda: open_(node, make(keys, runs[2]), runs[2], NOW), "replay_cache_full")
    mono.now += 61 + CLOCK_SKEW_S
    later = NOW + 61 + CLOCK_SKEW_S
    assert open_(node, make(keys, runs[2], now=later), runs[2], later) == SECRET


def test_a_reused_key_agreement_opens_each_envelope_once_and_is_renewed_r_mgd_12(keys):
    """R-MGD-12 (the envelope's cost): the Edge reuses one ephemeral key per Node for a
    bounded count and time; each envelope still has its own id and nonce, opens on the
    Node, and a replay of any of them is refused; past the bound a new key is agreed."""
    ephemeral = EphemeralKeys(max_uses=2, max_age_s=30)
    recipient = keys["recipient"].public_key()
    node = opener(keys)
    envelopes = []
    for i, now in enumerate((NOW, NOW + 1, NOW + 2, NOW + 40)):
        binding = dataclasses.replace(BINDING, run_id=f"r{i}")
        envelope = issue(
            SECRET,
            binding,
            recipient_key_id="node-a-1",
            recipient=recipient,
            issuer_key_id="iss-1",
            issuer=keys["issuer"],
            now=now,
            shared=ephemeral.for_recipient("node-a-1", recipient, now),
        )
        assert open_(node, envelope, binding, now) == SECRET
        with pytest.raises(EnvelopeRefused):
            open_(node, envelope, binding, now)
        envelopes.append(envelope)
    epks = [e["epk"] for e in envelopes]
    assert epks[0] == epks[1] != epks[2] != epks[3]  # two uses, then a new key; then age
    assert len({e["nonce"] for e in envelopes}) == len({e["id"] for e in envelopes}) == 4


def test_a_wall_clock_step_forward_then_back_never_reopens_a_used_envelope(keys) -> None:
    """The replay cache keeps ids by the monotonic clock: a wall clock stepped forward (ids
    look expired) then back (the envelope looks live again) cannot replay an envelope."""
    mono = Clock()
    node = opener(keys, size=8, monotonic=mono)
    first = make(keys, BINDING)
    assert open_(node, first, BINDING, NOW) == SECRET
    mono.now += 1
    ahead = NOW + 10_000  # an NTP step or an operator's date: every cached id looks expired
    other = dataclasses.replace(BINDING, run_id="r2")
    assert open_(node, make(keys, other, now=ahead), other, ahead) == SECRET
    mono.now += 1
    message = refused(lambda: open_(node, first, BINDING, NOW + 2), "expired")
    assert "expired" in message
    assert len(node._replay) == 2  # nothing was forgotten early
