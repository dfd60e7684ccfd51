"""`iop_keys issuer --out DIR` / `iop_keys node NODE --public-key FILE --out DIR`
(R-AUTH-4, R-MGD-4, R-TLS-5).

The issuer key (Ed25519) signs lease envelopes; it is made here, on the Edge that uses it,
created exclusively with mode 0600. A Node's recipient key (X25519) is made on that Node
(``iop-node keygen``); the Edge only registers its public key: ``node`` checks it is an
X25519 public key, copies it to ``DIR/NODE.pub`` and prints the ``credential_recipient``
entry with the key id derived from the key. docs/credentials.md.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from django.core.management.base import BaseCommand, CommandError, CommandParser

from nodes.envelope import MAX_KEY_FILE_BYTES, key_id
from secretref.keyfiles import PrivateFileError, create_private


def write_pair(out: Path, name: str, private: Ed25519PrivateKey | X25519PrivateKey) -> Path:
    """``name.key`` (PKCS#8 PEM, created exclusively, 0600) and ``name.pub``
    (SubjectPublicKeyInfo PEM); neither is ever overwritten."""
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
    try:
        create_private(key_file, pem)
    except PrivateFileError as exc:
        raise CommandError(str(exc)) from None
    pub_file.write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return key_file


def register_recipient(node_id: str, public_key: bytes, out: Path) -> tuple[Path, str]:
    """Check ``public_key`` is an X25519 public key (PEM) and write it to ``out/NODE.pub``
    (never overwritten); its path and key id."""
    if not node_id or "/" in node_id or node_id.startswith("."):
        raise CommandError(f"node id {node_id!r} cannot name a key file")
    if len(public_key) > MAX_KEY_FILE_BYTES:
        raise CommandError(f"the public key is larger than {MAX_KEY_FILE_BYTES} bytes")
    if b"PRIVATE KEY" in public_key:
        raise CommandError(
            "that is a private key: it stays on the Node; give the public key that "
            "`iop-node keygen` printed"
        )
    try:
        key = serialization.load_pem_public_key(public_key)
    except ValueError:
        raise CommandError("the public key is not a PEM public key") from None
    if not isinstance(key, X25519PublicKey):
        raise CommandError("the public key is not an X25519 key (make it with iop-node keygen)")
    path = out / f"{node_id}.pub"
    if path.exists():
        raise CommandError(f"{path} exists; keys are never overwritten")
    out.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return path, key_id(key)


class Command(BaseCommand):
    # System checks are `manage.py check`'s (run by make test) and runedge's: an operator
    # command skips them, and with them the import of every view (about 0.4 s of CPU).
    requires_system_checks: list[str] = []
    help = (
        "Managed-mode keys: `issuer` mints the Edge's Ed25519 signing key (issuer.key 0600 + "
        "issuer.pub); `node NODE --public-key FILE` registers a Node's X25519 public key, "
        "made on the Node by `iop-node keygen` (its private key never comes here)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="kind", required=True)
        issuer = sub.add_parser("issuer", help="The Edge's envelope signing key.")
        issuer.add_argument("--out", required=True, help="Directory for issuer.key/.pub.")
        node = sub.add_parser("node", help="Register a Node's recipient public key.")
        node.add_argument("node")
        node.add_argument(
            "--public-key", required=True, help="the PEM public key file, or - for stdin"
        )
        node.add_argument("--out", required=True, help="Directory for NODE.pub.")

    def handle(self, *args: Any, **options: Any) -> None:
        out = Path(options["out"])
        if options["kind"] == "issuer":
            key_file = write_pair(out, "issuer", Ed25519PrivateKey.generate())
            self.stdout.write(f"private key {key_file} (0600), public key {out / 'issuer.pub'}")
            return
        source = options["public_key"]
        try:
            data = (
                sys.stdin.buffer.read(MAX_KEY_FILE_BYTES + 1)
                if source == "-"
                else Path(source).read_bytes()[: MAX_KEY_FILE_BYTES + 1]
            )
        except OSError as exc:
            raise CommandError(f"cannot read {source} ({exc.strerror})") from None
        path, kid = register_recipient(options["node"], data, out)
        self.stdout.write(f"registered {path}, key id {kid}; in the Edge's config:")
        self.stdout.write(
            f"  credential_recipient: {{key_id: {kid}, public_key_file: {path.resolve()}}}"
        )
