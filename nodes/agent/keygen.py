"""``iop-node keygen --out DIR``: the Node makes its own recipient key pair (R-TLS-5).

The private key (X25519, PKCS#8 PEM) is created exclusively with mode 0600 and never leaves
this machine; the public key goes to the Edge (``nodes[].credential_recipient``), whose
operator registers it with ``manage.py iop_keys node NODE --public-key FILE``. The key id is
derived from the public key, so both sides name the same key. docs/credentials.md.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from nodes.envelope import key_id
from secretref.keyfiles import PrivateFileError, create_private

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="iop-node keygen", description="Make this Node's recipient key pair (X25519)."
    )
    parser.add_argument("--out", required=True, help="directory for NAME.key (0600) and NAME.pub")
    parser.add_argument("--name", default="recipient", help="file name stem (default recipient)")
    return parser


def keygen(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if not _NAME.match(args.name):
        print(f"iop-node keygen: --name {args.name!r} cannot name a key file", file=sys.stderr)
        return 2
    out = Path(args.out)
    key_file, pub_file = out / f"{args.name}.key", out / f"{args.name}.pub"
    if pub_file.exists():
        print(f"iop-node keygen: {pub_file} exists; keys are never overwritten", file=sys.stderr)
        return 1
    private = X25519PrivateKey.generate()
    public = private.public_key()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    try:
        out.mkdir(parents=True, exist_ok=True, mode=0o700)
        create_private(key_file, pem)
    except (PrivateFileError, OSError) as exc:
        print(f"iop-node keygen: {exc}", file=sys.stderr)
        return 1
    pub_file.write_bytes(public_pem)
    kid = key_id(public)
    print(f"private key {key_file} (0600; it stays on this machine)")
    print(f"public key {pub_file}, key id {kid}")
    print("node.yaml: credential_plane:")
    print(f"  recipient_key_id: {kid}")
    print(f"  recipient_private_key_file: {key_file.resolve()}")
    print("Give the Edge the public key below (iop_keys node NODE_ID --public-key FILE):")
    print(public_pem.decode("ascii"), end="")
    return 0
