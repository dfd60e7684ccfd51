"""`manage.py iop_token`: mint a caller or Node token; only its sha256 is ever stored (R-CFG-12)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from catalog.config import ConfigError
from catalog.documents import validated_change
from catalog.forms import issue_lines
from catalog.models import Node, PrincipalToken
from catalog.tokens import mint_token


class Command(BaseCommand):
    # System checks are `manage.py check`'s (run by make test) and runedge's: an operator
    # command skips them, and with them the import of every view (about 0.4 s of CPU).
    requires_system_checks: list[str] = []
    help = (
        "Mint a random token, print it once with its sha256; optionally store the hash "
        "on a Node (--node) or as a principal token (--principal). The raw token is never stored."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        target = parser.add_mutually_exclusive_group()
        target.add_argument("--node", metavar="NODE_ID", help="Set this Node's token hash.")
        target.add_argument(
            "--principal", metavar="TOKEN_REF", help="Add or replace this principal token entry."
        )
        parser.add_argument(
            "--principal-ref", metavar="REF", help="Principal of a --principal entry."
        )
        parser.add_argument("--alias", help="Optional alias of a --principal entry.")
        parser.add_argument("--json", action="store_true", help='Print {"token", "sha256"}.')

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["principal"] and (options["principal_ref"] or options["alias"]):
            raise CommandError("--principal-ref and --alias need --principal TOKEN_REF")
        token, digest = mint_token()
        try:
            stored = self.store(digest, options)
        except ConfigError as exc:
            for line in issue_lines(exc):
                self.stderr.write(line)
            raise CommandError(
                "the catalog would not load with this token; nothing stored"
            ) from None
        if options["json"]:
            self.stdout.write(json.dumps({"token": token, "sha256": digest}))
            return
        self.stdout.write(f"token:  {token}")
        self.stdout.write(f"sha256: {digest}")
        self.stdout.write(f"{stored}. The token is shown only now: keep it safe.")

    def store(self, digest: str, options: dict[str, Any]) -> str:
        """Write the hash where asked, kept only if the catalog still loads; say what was done."""
        if options["node"]:
            with validated_change():
                updated = Node.objects.filter(key=options["node"]).update(token_hash_sha256=digest)
                if not updated:
                    raise CommandError(f"no node with id {options['node']!r} in the catalog")
            return f"Stored as the token hash of node {options['node']}"
        if options["principal"]:
            with validated_change():
                return self.store_principal(digest, options)
        return "Not stored anywhere"

    def store_principal(self, digest: str, options: dict[str, Any]) -> str:
        ref = options["principal"]
        entry = PrincipalToken.objects.filter(token_ref=ref).first()
        if entry is None:
            if not options["principal_ref"]:
                raise CommandError(f"new principal token {ref!r} needs --principal-ref REF")
            entry = PrincipalToken(token_ref=ref)
        entry.token_hash_sha256 = digest
        if options["principal_ref"]:
            entry.principal_ref = options["principal_ref"]
        if options["alias"] is not None:
            entry.alias = options["alias"]
        verb = "Replaced" if entry.pk else "Added"
        entry.save()
        return f"{verb} principal token {ref}"
