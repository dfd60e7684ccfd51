"""`manage.py iop_node add|remove|rotate NODE_ID`: one Node journey each (docs/journeys.md).

Each command edits the catalog (kept only if the whole catalog still loads), then stores the
catalog as a revision staged for the next start: adding, removing a Node and changing its
token are restart-required (R-REF-2), and a restart drains running requests first.
``add`` and ``rotate`` mint the Node's token (only its sha256 is stored, R-CFG-12) and write a
ready ``node.yaml`` plus the raw token file (mode 0600) into a directory to copy to the Node.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from catalog.config import ConfigError
from catalog.documents import catalog_to_document, document_to_catalog, validate_catalog
from catalog.forms import issue_lines
from catalog.tokens import mint_token
from refresh import services

ACTOR = "manage.py iop_node"
TOKEN_FILE = "node.token"


class Command(BaseCommand):
    # System checks are `manage.py check`'s (run by make test) and runedge's: an operator
    # command skips them, and with them the import of every view (about 0.4 s of CPU).
    requires_system_checks: list[str] = []
    help = (
        "Add a Node (mint its token, write its node.yaml), remove one, or rotate its token; "
        "each change is staged for the next Edge start (docs/journeys.md)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        add = actions.add_parser("add", help="Add a Node to the catalog and mint its token.")
        add.add_argument("node_id")
        add.add_argument("--alias", default="", help="A display name.")
        add.add_argument(
            "--providers",
            metavar="FILE",
            help="YAML: providers: [...] as in nodes[].providers, and optional "
            "models: {MODEL_GROUP: {PROVIDER_ID: SERVED_NAME}} (docs/journeys.md).",
        )
        rotate = actions.add_parser("rotate", help="Mint a new token for a Node.")
        rotate.add_argument("node_id")
        for sub in (add, rotate):
            sub.add_argument(
                "--edge-url",
                help="The URL the Node dials (default: ws://<edge.listen>/ws/node of the "
                "catalog; it must be reachable from the Node's machine).",
            )
            sub.add_argument(
                "--out",
                help="Directory for node.yaml and node.token (default: ./NODE_ID).",
            )
        remove = actions.add_parser(
            "remove", help="Remove a Node, its providers and their model mappings."
        )
        remove.add_argument("node_id")

    def handle(self, *args: Any, **options: Any) -> None:
        node_id = options["node_id"]
        try:
            with transaction.atomic():
                token = self.change(options["action"], node_id, options)
                staged = services.create_from_catalog(ACTOR)
                if staged.revision is None:  # validated above: the catalog loads
                    raise CommandError("the catalog does not load; nothing changed")
                outcome = services.stage_revision(staged.revision, actor=ACTOR)
                if outcome.status != services.OK:
                    problems = "; ".join(e["message"] for e in outcome.body.get("errors", []))
                    raise CommandError(f"could not stage the change: {problems}")
        except ConfigError as exc:
            for line in issue_lines(exc):
                self.stderr.write(line)
            raise CommandError(
                "the catalog would not load after this change; nothing changed"
            ) from None
        if token is not None:
            self.write_node_files(node_id, token, options)
        self.stdout.write(
            f"Staged revision {outcome.body['revision']} (active: {outcome.body['active']}). "
            "Restart the Edge to activate it; running requests finish first."
        )

    def change(self, action: str, node_id: str, options: dict[str, Any]) -> str | None:
        """Edit the catalog as a document (kept only if it loads); the raw token if minted."""
        document = catalog_to_document()
        nodes = document.setdefault("nodes", [])
        node = next((n for n in nodes if n.get("id") == node_id), None)
        token = None
        if action == "add":
            if node is not None:
                raise CommandError(
                    f"node {node_id!r} is already in the catalog "
                    f"(new token: iop_node rotate {node_id})"
                )
            token, digest = mint_token()
            extra = read_providers(options["providers"]) if options["providers"] else {}
            entry = {"id": node_id, "token_hash_sha256": digest}
            if options["alias"]:
                entry["alias"] = options["alias"]
            nodes.append({**entry, "providers": extra.get("providers", [])})
            add_mappings(document, extra.get("models", {}))
        elif node is None:
            raise CommandError(
                f"no node with id {node_id!r} in the catalog (add one: iop_node add {node_id})"
            )
        elif action == "remove":
            nodes.remove(node)
            gone = {p.get("id") for p in node.get("providers", [])}
            for group in document.get("models", []):
                group["providers"] = {
                    k: v for k, v in group.get("providers", {}).items() if k not in gone
                }
        else:
            token, node["token_hash_sha256"] = mint_token()
        document_to_catalog(document)
        return token

    def write_node_files(self, node_id: str, token: str, options: dict[str, Any]) -> None:
        out = Path(options["out"] or node_id)
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(token + "\n")
        url = options["edge_url"] or default_edge_url()
        (out / "node.yaml").write_text(
            f"node_id: {node_id}\n"
            f"edge_url: {url}\n"
            f"token: {{file: {TOKEN_FILE}}}    # relative to this file; keep it private\n"
        )
        self.stdout.write(
            f"Wrote {out / 'node.yaml'} and {out / TOKEN_FILE} (the raw token, shown nowhere "
            f"else). Copy the directory to the Node's machine."
        )
        if url.startswith(("ws://127.", "ws://localhost", "ws://[::1]")):
            self.stdout.write(
                f"Note: {url} is loopback; a Node on another machine needs edge.listen on an "
                "address it can reach and TLS: --edge-url wss://EDGE_HOST:PORT/ws/node "
                "(docs/journeys.md)."
            )


def read_providers(file: str) -> dict[str, Any]:
    """``{providers: [...], models: {group: {provider id: served name}}}`` from a YAML file."""
    try:
        data = yaml.safe_load(Path(file).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CommandError(f"{file}: cannot read ({exc})") from None
    if not isinstance(data, dict) or not set(data) <= {"providers", "models"}:
        raise CommandError(f"{file}: a mapping with providers: [...] and optional models: {{}}")
    return data


def add_mappings(document: dict[str, Any], models: Any) -> None:
    """Map the new providers into existing model groups (``models: {group: {id: served}}``)."""
    if not isinstance(models, dict):
        raise CommandError("models: a mapping of model group id -> {provider id: served name}")
    groups = {g.get("id"): g for g in document.get("models", [])}
    for group_id, targets in models.items():
        if group_id not in groups:
            raise CommandError(f"models.{group_id}: no such model group in the catalog")
        if not isinstance(targets, dict):
            raise CommandError(f"models.{group_id}: a mapping of provider id -> served name")
        groups[group_id].setdefault("providers", {}).update(targets)


def default_edge_url() -> str:
    """``ws://<edge.listen>/ws/node`` (``wss://`` with ``edge.tls``) from the catalog."""
    edge = validate_catalog().document.get("edge", {})
    scheme = "wss" if edge.get("tls") else "ws"
    return f"{scheme}://{edge.get('listen', '127.0.0.1:7700')}/ws/node"
