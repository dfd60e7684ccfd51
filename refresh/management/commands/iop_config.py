"""`manage.py iop_config validate|import|export`: config files <-> the catalog tables.

It lives in ``refresh`` because ``export --revision`` reads revisions: ``catalog`` never imports
``refresh`` (docs/architecture.md, "Packages and allowed imports").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import yaml
from django.core.management.base import BaseCommand, CommandError, CommandParser

from catalog.config import ConfigError, load_snapshot, parse_text
from catalog.documents import catalog_is_empty, catalog_to_document, document_to_catalog
from catalog.forms import issue_lines
from catalog.models import ModelGroup, Node, Provider
from refresh.models import ConfigRevision


class Command(BaseCommand):
    # System checks are `manage.py check`'s (run by make test) and runedge's: an operator
    # command skips them, and with them the import of every view (about 0.4 s of CPU).
    requires_system_checks: list[str] = []
    help = "Validate a config file, import it into the catalog, or export the catalog."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        validate = actions.add_parser("validate", help="Check a config file; print every error.")
        validate.add_argument("file", help="YAML or JSON config document")
        load = actions.add_parser("import", help="Replace the whole catalog with a config file.")
        load.add_argument("file", help="YAML or JSON config document")
        load.add_argument(
            "--if-empty",
            action="store_true",
            help="Import only when the catalog holds nothing yet (first start).",
        )
        export = actions.add_parser(
            "export", help="Print the catalog (or a revision) as a config document."
        )
        export.add_argument("--format", choices=("yaml", "json"), default="yaml")
        export.add_argument(
            "--revision",
            metavar="active|previous|ID",
            help="Print a revision instead of the catalog: the one that runs (active), the one "
            "active before it (previous), or a revision id.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "validate":
            self.read_valid(options["file"])
            self.stdout.write("ok")
        elif action == "import":
            self.import_file(options["file"], if_empty=options["if_empty"])
        else:
            which = options["revision"]
            document = catalog_to_document() if which is None else revision_document(which)
            self.stdout.write(render(document, options["format"]), ending="")

    def import_file(self, file: str, *, if_empty: bool) -> None:
        if if_empty and not catalog_is_empty():
            self.stdout.write("catalog not empty: nothing imported")
            return
        document = self.read_valid(file)
        try:
            document_to_catalog(document)
        except ConfigError as exc:  # validated above; kept for a file changed in between
            self.fail(file, exc)
        self.stdout.write(
            f"imported {file}: {Node.objects.count()} nodes, {Provider.objects.count()} "
            f"providers, {ModelGroup.objects.count()} model groups"
        )

    def read_valid(self, file: str) -> dict[str, Any]:
        """Read, parse and validate `file`; on any issue print them all and fail."""
        path = Path(file)
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise CommandError(f"{file}: cannot read ({exc.strerror})") from None
        try:
            document = parse_text(text)
            load_snapshot(document)
        except ConfigError as exc:
            self.fail(file, exc)
        return document

    def fail(self, file: str, exc: ConfigError) -> NoReturn:
        lines = issue_lines(exc)
        for line in lines:
            self.stderr.write(line)
        raise CommandError(f"{file}: {len(lines)} error(s); nothing changed")


def revision_document(which: str) -> dict[str, Any]:
    """The document of the active revision, of its parent (``previous``), or of an id."""
    active = ConfigRevision.objects.filter(is_active=True).first()
    if which in ("active", "previous"):
        if active is None:
            raise CommandError("no revision is active yet (start the Edge once)")
        revision = active if which == "active" else active.parent
        if revision is None:
            raise CommandError(f"the active revision {active.pk} has no previous revision")
    elif which.isdigit():
        revision = ConfigRevision.objects.filter(pk=int(which)).first()
        if revision is None:
            raise CommandError(f"no revision {which}")
    else:
        raise CommandError("--revision is active, previous or a revision id")
    return dict(revision.document)


def render(document: dict[str, Any], fmt: str) -> str:
    """The document as YAML (document order kept) or indented JSON."""
    if fmt == "json":
        return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, default_flow_style=False)
