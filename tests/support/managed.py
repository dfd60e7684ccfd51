"""Managed-mode key material minted in the test (R-AUTH-4, R-MGD-4): the issuer pair, a
Node's recipient pair, envelopes issued as the Edge issues them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from catalog.management.commands.iop_keys import write_pair
from nodes.envelope import Binding, issue
from tests.support.stack import Stack
from tests.support.tls import Pki

ISSUER_KEY_ID = "edge-issuer-test"


@dataclass
class ManagedKeys:
    directory: Path
    node_id: str

    @property
    def issuer_key(self) -> Path:
        return self.directory / "issuer.key"

    @property
    def node_pub(self) -> Path:
        return self.directory / f"{self.node_id}.pub"

    def node_plane(self, replay_cache_size: int = 64) -> dict[str, Any]:
        """The Node's ``credential_plane`` block (node.yaml)."""
        return {
            "recipient_key_id": f"{self.node_id}-recipient",
            "recipient_private_key_file": str(self.directory / f"{self.node_id}.key"),
            "issuer_key_id": ISSUER_KEY_ID,
            "issuer_public_key_file": str(self.directory / "issuer.pub"),
            "replay_cache_size": replay_cache_size,
        }

    def envelope(
        self,
        secret: bytes,
        binding: Binding,
        *,
        issuer: Ed25519PrivateKey | None = None,
        now: float | None = None,
        ttl_s: float = 60,
    ) -> dict[str, Any]:
        """An envelope issued exactly as the Edge issues it (``issuer`` forges one)."""
        signer = issuer or serialization.load_pem_private_key(
            self.issuer_key.read_bytes(), password=None
        )
        recipient = serialization.load_pem_public_key(self.node_pub.read_bytes())
        assert isinstance(signer, Ed25519PrivateKey)
        return issue(
            secret,
            binding,
            recipient_key_id=f"{self.node_id}-recipient",
            recipient=recipient,  # type: ignore[arg-type]
            issuer_key_id=ISSUER_KEY_ID,
            issuer=signer,
            now=time.time() if now is None else now,
            ttl_s=ttl_s,
        )


def mint_keys(directory: Path, node_id: str) -> ManagedKeys:
    """issuer.key/.pub and NODE.key/.pub in ``directory``, as ``iop_keys`` writes them."""
    write_pair(directory, "issuer", Ed25519PrivateKey.generate())
    write_pair(directory, node_id, X25519PrivateKey.generate())
    return ManagedKeys(directory, node_id)


def managed_document(keys: ManagedKeys, keyring_file: Path) -> dict[str, Any]:
    """A managed-mode Edge document for in-process and catalog tests: one Node (``keys``'s
    node id) with two GLM General providers and one GLM Coding Plan provider; model groups
    ``glm`` (all three) and ``coder`` (the Coding Plan one)."""
    upstream = "http://127.0.0.1:9/v4"
    return {
        "edge": {
            "id": "e",
            "listen": "127.0.0.1:17000",
            "tls": {"cert_file": "edge.crt", "key_file": "edge.key"},
        },
        "admin": {"listen": "127.0.0.1:17001"},
        "provider_pool": {"max_queue": 4, "queue_timeout_ms": 30000},
        "openai": {
            "listen": "127.0.0.1:17002",
            "tls": {"cert_file": "api.crt", "key_file": "api.key"},
        },
        "credential_plane": {
            "enabled": True,
            "issuer": {"key_id": ISSUER_KEY_ID, "private_key_file": str(keys.issuer_key)},
            "keyring_file": str(keyring_file),
        },
        "nodes": [
            {
                "id": keys.node_id,
                "token_hash_sha256": "0" * 64,
                "credential_recipient": {
                    "key_id": f"{keys.node_id}-recipient",
                    "public_key_file": str(keys.node_pub),
                },
                "providers": [
                    {"id": "glm-general", "profile": "glm", "base_url": upstream},
                    {"id": "glm-general-2", "profile": "glm", "base_url": upstream},
                    {"id": "glm-coding", "profile": "glm_coding", "base_url": upstream},
                ],
            }
        ],
        "models": [
            {
                "id": "glm",
                "providers": {
                    "glm-general": "glm-4.6",
                    "glm-general-2": "glm-4.6",
                    "glm-coding": "glm-4.6",
                },
            },
            {"id": "coder", "providers": {"glm-coding": "glm-4.6"}},
        ],
    }


def managed_stack(
    directory: Path,
    pki: Pki,
    keys: ManagedKeys,
    *,
    extra_providers: Sequence[dict[str, Any]] = (),
    extra_models: Sequence[dict[str, Any]] = (),
    **options: Any,
) -> Stack:
    """A managed-mode ``Stack`` (not started) over TLS: Edge https and wss with ``pki``'s
    certificate, one Node ``keys.node_id`` with a GLM General provider ``glm-general``
    (capacity 2) and a GLM Coding Plan one ``glm-coding`` on the fake upstream ``main``, model
    groups ``glm`` and ``coder``, and its keyring ``directory/keyring.json`` made with
    ``iop_keyring init`` (key id ``k1``). ``extra_providers`` / ``extra_models`` join them;
    ``options`` go to ``Stack`` (``upstreams``, ``log_level``...). The Edge looks for changed
    routes and slots every 0.2 s (``IOP_REVISION_POLL_S``, 1 s by default), so a test's change
    is followed soon; ``env`` in ``options`` may set it otherwise."""
    tls = {"cert_file": str(pki.edge.cert), "key_file": str(pki.edge.key)}
    keyring = directory / "keyring.json"
    providers = [
        {"id": "glm-general", "profile": "glm", "base_url": "{up:main}/v1", "capacity": 2},
        {"id": "glm-coding", "profile": "glm_coding", "base_url": "{up:main}/v1"},
        *extra_providers,
    ]
    node = keys.node_id
    stack = Stack(
        directory / "stack",
        edge={"tls": tls},
        openai={"tls": tls, "principal_tokens": []},
        credential_plane={
            "enabled": True,
            "issuer": {"key_id": ISSUER_KEY_ID, "private_key_file": str(keys.issuer_key)},
            "keyring_file": str(keyring),
        },
        nodes=[
            {
                "id": node,
                "providers": providers,
                "config": {
                    "tls": {"ca_file": str(pki.ca_file)},
                    "credential_plane": keys.node_plane(),
                },
                "recipient": {"key_id": f"{node}-recipient", "public_key_file": str(keys.node_pub)},
            }
        ],
        models=[
            {"id": "glm", "providers": {"glm-general": "glm-4.6"}},
            {"id": "coder", "providers": {"glm-coding": "glm-4.6"}},
            *extra_models,
        ],
        env={"IOP_REVISION_POLL_S": "0.2", **options.pop("env", {})},
        **options,
    )
    stack.manage("iop_keyring", "init", str(keyring), "--key-id", "k1")
    return stack
