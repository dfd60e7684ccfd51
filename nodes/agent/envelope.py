"""Per-run lease envelopes, the Node's half: verify, check the binding, refuse replays, open.

R-MGD-4 / R-AUTH-4. The secret comes back as bytes for the one upstream call that needs
it; nothing here keeps it. Errors name what failed, never the secret.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from nodes.envelope import VERSION, Binding, canonical, derive_key, raw_public, unb64

CLOCK_SKEW_S = 30  # an envelope is accepted this long past its expiry (Edge and Node clocks)
_HEADER = ("v", "id", "issuer", "recipient", "expires_at", "epk", *Binding.__slots__)


class EnvelopeRefused(Exception):
    """The envelope cannot be used; ``reason`` is a stable word for logs and run errors."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ReplayCache:
    """Envelope ids seen and not yet expired, at most ``size`` of them (R-AUTH-4).

    Each id is kept until a deadline on the monotonic clock (its remaining life when it was
    admitted), so a step of the wall clock never makes the cache forget an id early. When it
    is full of live ids a new envelope is refused rather than an id forgotten early, which
    would let that envelope be replayed. Ids leave in arrival order once expired; one with a
    later deadline may keep younger expired ones a little longer.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._seen: OrderedDict[str, float] = OrderedDict()  # id -> monotonic deadline

    def admit(self, envelope_id: str, keep_s: float, mono: float) -> None:
        while self._seen and next(iter(self._seen.values())) < mono:
            self._seen.popitem(last=False)
        if envelope_id in self._seen:
            raise EnvelopeRefused("replayed", "the lease envelope was already used")
        if len(self._seen) >= self.size:
            raise EnvelopeRefused("replay_cache_full", "the replay cache is full of live envelopes")
        self._seen[envelope_id] = mono + keep_s  # deadlines arrive nearly in order: no sort

    def __len__(self) -> int:
        return len(self._seen)


class SteadyClock:
    """Wall-clock seconds that never go back and advance at least as fast as the monotonic
    clock: a forward step is followed (envelopes expire sooner), a backward one is not (an
    envelope the replay cache has forgotten never becomes live again)."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._last: tuple[float, float] | None = None

    def read(self, wall: float) -> tuple[float, float]:
        """(steady wall time, monotonic time) for a wall-clock reading ``wall``."""
        mono = self._monotonic()
        if self._last is not None:
            last_wall, last_mono = self._last
            wall = max(wall, last_wall + (mono - last_mono))
        self._last = (wall, mono)
        return wall, mono


class EnvelopeOpener:
    """The Node's recipient key, the issuer keys it trusts, and its replay cache."""

    def __init__(
        self,
        *,
        recipient_key_id: str,
        recipient: X25519PrivateKey,
        issuers: dict[str, Ed25519PublicKey],
        replay_cache_size: int,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.recipient_key_id = recipient_key_id
        self._recipient = recipient
        self._recipient_raw = raw_public(recipient.public_key())
        self._issuers = dict(issuers)
        self._replay = ReplayCache(replay_cache_size)
        self._clock = SteadyClock(monotonic)

    def open(
        self,
        envelope: Any,
        *,
        run_id: str,
        node_id: str,
        provider_id: str,
        generation: int | None,
        now: float,
    ) -> bytes:
        """The secret for the run this Node received (its id, this Node, the run's provider,
        this connection's generation), or ``EnvelopeRefused``. The slot, credential revision
        and route revision are signed and bound as associated data; the Node has no other
        source for them."""
        if not isinstance(envelope, dict):
            raise EnvelopeRefused("malformed", "the lease envelope is not an object")
        if envelope.get("v") != VERSION:
            raise EnvelopeRefused("malformed", "unknown lease envelope version")
        issuer_id = envelope.get("issuer")
        issuer = self._issuers.get(issuer_id) if isinstance(issuer_id, str) else None
        if issuer is None:
            raise EnvelopeRefused(
                "unknown_issuer", "the lease envelope's issuer key is not trusted"
            )
        signed = {k: v for k, v in envelope.items() if k != "sig"}
        try:
            issuer.verify(unb64(envelope.get("sig")), canonical(signed))
        except (InvalidSignature, ValueError):
            raise EnvelopeRefused(
                "bad_signature", "the lease envelope's signature does not verify"
            ) from None
        if envelope.get("recipient") != self.recipient_key_id:
            raise EnvelopeRefused("wrong_recipient", "the lease envelope is sealed to another key")
        expected = {
            "run_id": run_id,
            "node_id": node_id,
            "provider_id": provider_id,
            "generation": generation,
        }
        for name, want in expected.items():
            if envelope.get(name) != want:
                raise EnvelopeRefused(
                    "wrong_binding", f"the lease envelope is bound to another {name}"
                )
        expires_at = envelope.get("expires_at")
        now, mono = self._clock.read(now)
        if not isinstance(expires_at, int) or expires_at + CLOCK_SKEW_S < now:
            raise EnvelopeRefused("expired", "the lease envelope has expired")
        header = {k: envelope.get(k) for k in _HEADER}
        try:
            epk = unb64(envelope.get("epk"))
            shared = self._recipient.exchange(X25519PublicKey.from_public_bytes(epk))
            key = derive_key(shared, epk, self._recipient_raw)
            nonce, sealed = unb64(envelope.get("nonce")), unb64(envelope.get("ct"))
            secret = ChaCha20Poly1305(key).decrypt(nonce, sealed, canonical(header))
        except (InvalidTag, ValueError):
            raise EnvelopeRefused("does_not_open", "the lease envelope does not open") from None
        self._replay.admit(str(envelope.get("id")), expires_at + CLOCK_SKEW_S - now, mono)
        return secret
