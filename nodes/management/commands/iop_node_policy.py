"""python manage.py iop_node_policy NODE_ID [--config FILE]: the node.yaml ``policy`` that
allows exactly what this Edge's config gives that Node (R-TLS-3, R-TLS-6..8, docs/node.md):
exact argv, the environment names its programs get, secret files one by one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from django.core.management.base import BaseCommand, CommandError, CommandParser

from catalog.config import ConfigError, load_snapshot, parse_text
from nodes.agent.policy import policy_for
from nodes.payload import compile_payload


class Command(BaseCommand):
    # System checks are `manage.py check`'s (run by make test) and runedge's: an operator
    # command skips them, and with them the import of every view (about 0.4 s of CPU).
    requires_system_checks: list[str] = []
    help = "Print a node.yaml policy allowing exactly the providers the Edge gives NODE_ID."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("node_id")
        parser.add_argument("--config", help="a config file instead of the catalog")

    def handle(self, *args: Any, **options: Any) -> None:
        from catalog.documents import catalog_to_document

        try:
            if options["config"]:
                document = parse_text(Path(options["config"]).read_bytes())
            else:
                document = catalog_to_document()
            snapshot = load_snapshot(document)
        except (OSError, ConfigError) as exc:
            raise CommandError(f"cannot read the config: {exc}") from None
        if snapshot.node(options["node_id"]) is None:
            raise CommandError(f"no node {options['node_id']} in the config")
        payload = compile_payload(snapshot, options["node_id"])
        self.stdout.write(yaml.safe_dump({"policy": policy_for(payload)}, sort_keys=False))
