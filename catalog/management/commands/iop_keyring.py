"""`manage.py iop_keyring init FILE` / `iop_keyring rotate`: the slot keyring (R-MGD-2)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from catalog.slots import CredentialError, init_keyring, keyring_path, rotate_keyring


def _key_id() -> str:
    return "k" + datetime.now(UTC).strftime("%Y%m%dT%H%M%S")


class Command(BaseCommand):
    help = (
        "The keyring sealing credential slots at rest (AES-256-GCM). `init FILE` writes a new "
        "keyring (0600); `rotate` adds a key and re-seals every slot with it in one transaction."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        init = sub.add_parser("init", help="Write a new keyring file with one key.")
        init.add_argument("file")
        init.add_argument("--key-id", help="Id of the first key (default: k<UTC time>).")
        rotate = sub.add_parser("rotate", help="Add a key and re-seal every slot with it.")
        rotate.add_argument(
            "--keyring", help="Keyring file (default: credential_plane.keyring_file)."
        )
        rotate.add_argument("--key-id", help="Id of the new key (default: k<UTC time>).")

    def handle(self, *args: Any, **options: Any) -> None:
        key_id = options["key_id"] or _key_id()
        try:
            if options["action"] == "init":
                init_keyring(options["file"], key_id)
                self.stdout.write(f"keyring {options['file']} written with key {key_id} (0600)")
                return
            path = keyring_path(None, options["keyring"])
            count = rotate_keyring(path, key_id)
        except CredentialError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"keyring {path}: new key {key_id}; {count} slot(s) re-sealed")
