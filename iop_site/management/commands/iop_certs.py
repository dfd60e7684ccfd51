"""python manage.py iop_certs DIR --name HOST ... --node NODE_ID ...: a local CA, an Edge
server certificate and Node client certificates, so TLS is two commands (docs/node.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from iop_site import certs


class Command(BaseCommand):
    # System checks are `manage.py check`'s (run by make test) and runedge's: an operator
    # command skips them, and with them the import of every view (about 0.4 s of CPU).
    requires_system_checks: list[str] = []
    help = (
        "Mint a local CA (reused when DIR already holds ca.crt/ca.key), an Edge server "
        "certificate for the given names/IPs, and one client certificate per Node."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("directory", help="where to write the PEM files")
        parser.add_argument(
            "--name",
            action="append",
            default=[],
            help="a DNS name or IP address the Nodes and clients use for the Edge (repeat)",
        )
        parser.add_argument(
            "--node", action="append", default=[], help="a Node id to issue a client cert for"
        )
        parser.add_argument(
            "--days", type=int, default=certs.DEFAULT_DAYS, help="leaf certificate lifetime"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        directory = Path(options["directory"])
        names: list[str] = options["name"] or ["localhost", "127.0.0.1"]
        if options["days"] < 1:
            raise CommandError("--days must be >= 1")
        ca_cert, ca_key = directory / "ca.crt", directory / "ca.key"
        if ca_cert.exists() and ca_key.exists():
            try:
                ca = certs.load(ca_cert, ca_key)
            except (OSError, ValueError) as exc:
                raise CommandError(f"cannot reuse the CA in {directory}: {exc}") from None
            self.stdout.write(f"reusing CA {ca_cert}")
        else:
            ca = certs.new_ca()
            ca.write(directory, "ca")
            self.stdout.write(f"CA: {ca_cert} (keep {ca_key} offline)")
        # R-TLS-5: a key file is never overwritten; an existing pair is kept as it is.
        if (directory / "edge.key").exists():
            self.stdout.write(f"keeping {directory / 'edge.crt'} (remove edge.* to mint anew)")
        else:
            edge = certs.issue(ca, names[0], names=names, server=True, days=options["days"])
            cert, key = edge.write(directory, "edge")
            self.stdout.write(f"Edge: {cert} {key} for {', '.join(names)}")
        for node_id in options["node"]:
            if (directory / f"node-{node_id}.key").exists():
                raise CommandError(
                    f"{directory / f'node-{node_id}.key'} exists; keys are never overwritten"
                )
            node = certs.issue(ca, node_id, server=False, days=options["days"])
            cert, key = node.write(directory, f"node-{node_id}")
            self.stdout.write(f"Node {node_id}: {cert} {key}")
