"""`manage.py iop_keys issuer --out DIR` / `iop_keys node NODE --out DIR` (R-AUTH-4, R-MGD-4).

The issuer key (Ed25519) signs lease envelopes on the Edge; a Node's recipient key (X25519)
opens them on that Node. Private keys are written 0600 and never overwritten.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from django.core.management.base import BaseCommand, CommandError, CommandParser

from catalog.keyring import write_private


def write_pair(out: Path, name: str, private: Ed25519PrivateKey | X25519PrivateKey) -> Path:
    """``name.key`` (PKCS#8 PEM, 0600) and ``name.pub`` (SubjectPublicKeyInfo PEM)."""
    key_file, pub_file = out / f"{name}.key", out / f"{name}.pub"
    for path in (key_file, pub_file):
        if path.exists():
            raise CommandError(f"{path} exists; keys are never overwritten")
    out.mkdir(parents=True, exist_ok=True)
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    write_private(key_file, pem.decode("ascii"))
    pub_file.write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return key_file


class Command(BaseCommand):
    help = (
        "Mint managed-mode keys: `issuer` (Ed25519: issuer.key 0600 + issuer.pub) for the "
        "Edge, `node NODE` (X25519: NODE.key 0600 + NODE.pub) for a Node's recipient key."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="kind", required=True)
        issuer = sub.add_parser("issuer", help="The Edge's envelope signing key.")
        issuer.add_argument("--out", required=True, help="Directory for issuer.key/.pub.")
        node = sub.add_parser("node", help="A Node's envelope recipient key.")
        node.add_argument("node")
        node.add_argument("--out", required=True, help="Directory for NODE.key/.pub.")

    def handle(self, *args: Any, **options: Any) -> None:
        out = Path(options["out"])
        if options["kind"] == "issuer":
            name = "issuer"
            key_file = write_pair(out, name, Ed25519PrivateKey.generate())
        else:
            name = options["node"]
            if not name or "/" in name or name.startswith("."):
                raise CommandError(f"node id {name!r} cannot name a key file")
            key_file = write_pair(out, name, X25519PrivateKey.generate())
        self.stdout.write(f"private key {key_file} (0600), public key {out / (name + '.pub')}")
