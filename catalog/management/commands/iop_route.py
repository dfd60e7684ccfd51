"""`manage.py iop_route create ROUTE --model GROUP --slot PROVIDER_OR_PROFILE=SLOT ...`,
`iop_route rotate ROUTE`, `list`, `delete`."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from catalog.models import Route
from catalog.slots import CredentialError, create_route, parse_bindings, rotate_route_key


class Command(BaseCommand):
    # System checks are `manage.py check`'s (run by make test) and runedge's: an operator
    # command skips them, and with them the import of every view (about 0.4 s of CPU).
    requires_system_checks: list[str] = []
    help = (
        "Managed routes (R-MGD-3): `create` prints the route key once (only its sha256 is "
        "stored); `rotate` gives a route a new key (the old one stops working); `list` shows "
        "routes and their slots; `delete` removes one."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="Create a route and print its key once.")
        create.add_argument("route")
        create.add_argument("--model", required=True, help="The model group it may call.")
        create.add_argument(
            "--slot",
            action="append",
            default=[],
            metavar="PROVIDER_OR_PROFILE=SLOT",
            help="The slot for a provider id or for every provider of a profile (repeatable).",
        )
        create.add_argument("--principal-ref", default="", help="Metering label (default: id).")
        create.add_argument("--json", action="store_true", help='Print {"route", "key"}.')
        rotate = sub.add_parser("rotate", help="Mint a new key for a route; print it once.")
        rotate.add_argument("route")
        rotate.add_argument("--json", action="store_true", help='Print {"route", "key"}.')
        sub.add_parser("list", help="Routes, groups, slots and revisions.")
        delete = sub.add_parser("delete", help="Delete a route (its key stops working).")
        delete.add_argument("route")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "list":
            for route in Route.objects.prefetch_related("slots__slot"):
                slots = " ".join(str(binding) for binding in route.slots.all())
                self.stdout.write(f"{route.key}\t{route.model_group}\t{slots}\tr{route.revision}")
            return
        if action == "delete":
            deleted, _ = Route.objects.filter(key=options["route"]).delete()
            if not deleted:
                raise CommandError(f"no route {options['route']!r}")
            self.stdout.write(f"route {options['route']} deleted")
            return
        try:
            if action == "rotate":
                key = rotate_route_key(options["route"])
            else:
                key = create_route(
                    options["route"],
                    options["model"],
                    parse_bindings(options["slot"]),
                    principal_ref=options["principal_ref"],
                )
        except CredentialError as exc:
            raise CommandError(str(exc)) from None
        if options["json"]:
            self.stdout.write(json.dumps({"route": options["route"], "key": key}))
            return
        self.stdout.write(f"route: {options['route']}")
        self.stdout.write(f"key:   {key}")
        self.stdout.write("The key is shown only now: only its sha256 is stored.")
