"""Managed mode on the Node: open a run's lease envelope into that run's slot secret.

R-MGD-4 / R-AUTH-4. The keys come from ``credential_plane`` in node.yaml (external files).
The secret lives only in the one run it was issued for (its upstream auth header, or a cli
program's environment, R-MGD-11): it is not logged, not stored on any object that outlives
the run. docs/credentials.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from nodes.agent.config import CredentialPlane
from nodes.agent.envelope import EnvelopeOpener, EnvelopeRefused
from nodes.envelope import load_key
from nodes.wire import ProviderPayload


def load_opener(plane: CredentialPlane) -> EnvelopeOpener:
    """The Node's recipient key and trusted issuer key, checked at start (``KeyFileError``)."""
    recipient: X25519PrivateKey = load_key(
        plane.recipient_private_key_file,
        "credential_plane.recipient_private_key_file",
        X25519PrivateKey,
        "X25519",
        private=True,
    )
    issuer: Ed25519PublicKey = load_key(
        plane.issuer_public_key_file,
        "credential_plane.issuer_public_key_file",
        Ed25519PublicKey,
        "Ed25519",
        private=False,
    )
    return EnvelopeOpener(
        recipient_key_id=plane.recipient_key_id,
        recipient=recipient,
        issuers={plane.issuer_key_id: issuer},
        replay_cache_size=plane.replay_cache_size,
    )


class LeaseCredentials:
    """Turns a run's envelope into the slot secret of that run only."""

    def __init__(
        self,
        opener: EnvelopeOpener | None,
        node_id: str,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._opener = opener
        self._node_id = node_id
        self._clock = clock

    def secret(
        self,
        envelope: dict[str, Any] | None,
        *,
        run_id: str,
        provider: ProviderPayload | None,
        generation: int | None,
    ) -> str | None:
        """The envelope's secret for this run (None in legacy mode)."""
        if self._opener is None:
            if envelope is not None:
                raise EnvelopeRefused(
                    "no_recipient_key",
                    "this node has no credential_plane recipient key for a lease envelope",
                )
            return None
        if envelope is None:
            raise EnvelopeRefused("missing", "the run carries no lease envelope (managed node)")
        if provider is None:
            raise EnvelopeRefused("unknown_provider", "the envelope's provider is not on this node")
        secret = self._opener.open(
            envelope,
            run_id=run_id,
            node_id=self._node_id,
            provider_id=provider.id,
            generation=generation,
            now=self._clock(),
        )
        try:
            return secret.decode("utf-8")
        except UnicodeDecodeError:
            raise EnvelopeRefused("malformed", "the lease envelope's secret is not UTF-8") from None
