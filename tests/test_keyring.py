"""Slot secrets sealed at rest under the keyring file (R-MGD-2)."""

from __future__ import annotations

import base64
import json
import stat

import pytest

from catalog.keyring import Keyring, KeyringError, new_keyring
from secretref.keyfiles import create_private

SECRET = b"sk-canary-keyring-51c2"


def test_a_sealed_slot_secret_opens_only_for_its_slot_and_never_shows() -> None:
    ring = new_keyring("k1")
    sealed = ring.seal(SECRET, "slot-a")
    assert SECRET.decode() not in sealed
    assert ring.open(sealed, "slot-a") == SECRET
    with pytest.raises(KeyringError, match="does not open"):
        ring.open(sealed, "slot-b")


def test_the_newest_key_seals_and_older_keys_still_open() -> None:
    old = new_keyring("k1")
    sealed_old = old.seal(SECRET, "s")
    rotated = old.with_new_key("k2")
    assert rotated.newest == "k2"
    assert rotated.open(sealed_old, "s") == SECRET
    assert not rotated.sealed_with_newest(sealed_old)
    resealed = rotated.seal(rotated.open(sealed_old, "s"), "s")
    assert rotated.sealed_with_newest(resealed) and resealed.split(":")[1] == "k2"


def test_a_keyring_missing_the_key_id_names_it(tmp_path) -> None:
    sealed = new_keyring("gone").seal(SECRET, "s")
    with pytest.raises(KeyringError, match="'gone', not in the keyring"):
        new_keyring("k1").open(sealed, "s")


def test_a_tampered_sealed_value_is_refused() -> None:
    ring = new_keyring("k1")
    version, key_id, body = ring.seal(SECRET, "s").split(":")
    flipped = body[:-4] + ("AAAA" if body[-4:] != "AAAA" else "BBBB")
    with pytest.raises(KeyringError):
        ring.open(f"{version}:{key_id}:{flipped}", "s")
    with pytest.raises(KeyringError, match="malformed"):
        ring.open("garbage", "s")


def test_a_sealed_value_shorter_than_its_nonce_is_malformed_not_a_crash() -> None:
    """A corrupted row (or a routed grant, R-SCALE-7) too short to hold a nonce is refused
    as malformed, so the request gets 503 credential_unavailable, never a 500."""
    ring = new_keyring("k1")
    for body in ("", "AAAA", base64.b64encode(b"x" * 12).decode()):
        with pytest.raises(KeyringError, match="malformed"):
            ring.open(f"v1:k1:{body}", "s")


def test_the_keyring_file_round_trips_and_is_private(tmp_path) -> None:
    path = tmp_path / "keyring.json"
    ring = new_keyring("k1").with_new_key("k2")
    create_private(path, ring.dump().encode())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = Keyring.load(path)
    assert loaded.key_ids == ("k1", "k2") and loaded.newest == "k2"
    assert loaded.open(ring.seal(SECRET, "s"), "s") == SECRET


@pytest.mark.parametrize(
    "content, match",
    [
        ("{not json", "not a JSON object"),
        ("[]", "not a JSON object"),
        ('{"k1": "!!!"}', "not a JSON object"),
        ('{"k1": "c2hvcnQ="}', "32-byte key"),
        ("{}", "holds no key"),
    ],
)
def test_a_corrupted_keyring_file_is_refused_without_showing_keys(tmp_path, content, match) -> None:
    path = tmp_path / "keyring.json"
    path.write_text(content)
    with pytest.raises(KeyringError, match=match):
        Keyring.load(path)


def test_a_missing_keyring_file_names_the_path(tmp_path) -> None:
    with pytest.raises(KeyringError, match=str(tmp_path / "nope.json")):
        Keyring.load(tmp_path / "nope.json")


def test_keys_never_appear_in_errors(tmp_path) -> None:
    ring = new_keyring("k1")
    path = tmp_path / "k.json"
    doc = json.loads(ring.dump())
    doc["k1"] = doc["k1"][:-8]
    path.write_text(json.dumps(doc))
    with pytest.raises(KeyringError) as info:
        Keyring.load(path)
    assert doc["k1"] not in str(info.value)
