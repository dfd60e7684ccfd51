"""python manage.py runedge [--config FILE]: start the Edge on the listeners of its config."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = "Start the Edge (Node websocket, OpenAI-compatible API, admin) under daphne."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--config", help="config file to make the active revision (config as code)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from django.conf import settings

        from catalog.config import ConfigError
        from iop_site.server import ListenError, serve
        from iop_site.tls import TLSFileError, listeners
        from refresh.startup import startup_snapshot

        try:
            snapshot = startup_snapshot(options.get("config"))
        except ConfigError as exc:
            for issue in exc.issues:
                self.stderr.write(str(issue))
            raise CommandError(f"invalid config: {len(exc.issues)} error(s)") from None
        if snapshot.credential_plane is not None:  # R-MGD-4: every managed key readable
            from nodes.envelope import KeyFileError
            from pool.http.managed import ManagedPlane

            try:
                ManagedPlane(snapshot)
            except KeyFileError as exc:
                raise CommandError(f"managed mode cannot start: {exc}") from None
        names = " ".join(f"{it.role}={it.url()}" for it in listeners(snapshot))
        if snapshot.openai_tls is not None and not settings.IOP_HTTPS:
            self.stderr.write(
                "warning: openai.tls is on but IOP_HTTPS is not set: the admin's session and "
                "CSRF cookies are not marked Secure and no HSTS is sent (docs/configuration.md)"
            )

        def ready() -> None:
            sys.stdout.write(f"IOP Edge ready: {names}\n")  # R-TLS-1: https:// and wss://
            sys.stdout.flush()

        try:
            serve(snapshot, on_ready=ready)
        except TLSFileError as exc:
            raise CommandError(f"cannot start: {exc}") from None
        except ListenError as exc:
            for failure in exc.failures:
                self.stderr.write(failure)
            raise CommandError(
                "the Edge cannot listen (is another Edge already running on these ports? "
                "stop it, or change the listen addresses in the config)"
            ) from None
