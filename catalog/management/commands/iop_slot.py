"""`manage.py iop_slot set SLOT --profile PROFILE`: seal a provider secret read from stdin."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from catalog.models import CredentialSlot
from catalog.slots import (
    KEYRING_HINT,
    MAX_SECRET_BYTES,
    CredentialError,
    keyring_path,
    load_keyring,
    set_slot,
)


class Command(BaseCommand):
    # System checks are `manage.py check`'s (run by make test) and runedge's: an operator
    # command skips them, and with them the import of every view (about 0.4 s of CPU).
    requires_system_checks: list[str] = []
    help = (
        "Managed credential slots (R-MGD-2). `set` reads the secret from stdin and seals it "
        "under the keyring; `list` shows ids, profiles and revisions (never a secret)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        put = sub.add_parser("set", help="Create or replace a slot's secret (from stdin).")
        put.add_argument("slot")
        put.add_argument("--profile", required=True, help="The profile the secret is for.")
        put.add_argument("--keyring", help="Keyring file (default: credential_plane.keyring_file).")
        sub.add_parser("list", help="Slot ids, profiles and credential revisions.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "list":
            for slot in CredentialSlot.objects.all():
                self.stdout.write(
                    f"{slot.key}\t{slot.profile}\trevision {slot.credential_revision}"
                )
            return
        secret = sys.stdin.buffer.read(MAX_SECRET_BYTES + 1)
        try:
            keyring = load_keyring(keyring_path(None, options["keyring"], KEYRING_HINT))
            slot = set_slot(options["slot"], options["profile"], secret, keyring)
        except CredentialError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"slot {slot.key} ({slot.profile}) sealed under key {keyring.newest}: "
            f"credential revision {slot.credential_revision}"
        )
