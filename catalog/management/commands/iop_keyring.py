"""`manage.py iop_keyring init FILE` / `iop_keyring rotate`: the slot keyring (R-MGD-2)."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from catalog.slots import KEYRING_HINT, CredentialError, init_keyring, keyring_path, rotate_keyring


def _key_id() -> str:
    """``k<UTC time>-<6 random hex>``: two rotations in the same second never collide."""
    return "k" + datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)


class Command(BaseCommand):
    # System checks are `manage.py check`'s (run by make test) and runedge's: an operator
    # command skips them, and with them the import of every view (about 0.4 s of CPU).
    requires_system_checks: list[str] = []
    help = (
        "The keyring sealing credential slots at rest (AES-256-GCM): a JSON object of key id -> "
        "base64 key; the LAST entry is the newest key, which seals, and every entry opens. "
        "`init FILE` writes a new keyring (0600, never over an existing file); `rotate` appends "
        "a key and re-seals every slot with it in one transaction, replacing the file whole "
        "(written beside it, fsynced, renamed: a crash leaves the old file or the new one). "
        "docs/credentials.md."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        init = sub.add_parser("init", help="Write a new keyring file with one key.")
        init.add_argument("file")
        init.add_argument(
            "--key-id",
            help="Id of the first key (any text without ':') "
            "(default: k<UTC time>-<random hex>, unique).",
        )
        rotate = sub.add_parser("rotate", help="Add a key and re-seal every slot with it.")
        rotate.add_argument(
            "--keyring",
            metavar="FILE",
            help="Keyring file to rotate (default: the catalog's credential_plane.keyring_file).",
        )
        rotate.add_argument(
            "--key-id",
            help="Id of the new key, appended as the last (newest) entry; an id the keyring "
            "already holds is refused (default: k<UTC time>-<random hex>, unique).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        key_id = options["key_id"] or _key_id()
        try:
            if options["action"] == "init":
                init_keyring(options["file"], key_id)
                self.stdout.write(f"keyring {options['file']} written with key {key_id} (0600)")
                return
            path = keyring_path(None, options["keyring"], KEYRING_HINT)
            count = rotate_keyring(path, key_id)
        except CredentialError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"keyring {path}: new key {key_id}; {count} slot(s) re-sealed")
