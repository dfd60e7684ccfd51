"""python manage.py runedge [--config FILE] [--edge-id ID] [--edge-listen HOST:PORT]
[--openai-listen HOST:PORT] [--admin-listen HOST:PORT]: start the Edge on the listeners of its
config; the flags win over IOP_EDGE_ID / IOP_*_LISTEN (docs/configuration.md)."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from obskit.logs import announce


class Command(BaseCommand):
    help = "Start the Edge (Node websocket, OpenAI-compatible API, admin) under daphne."
    # No system checks at start: they check code (every ModelAdmin, URL pattern and template
    # tag library), which `manage.py check` does in `make test`, and importing every admin
    # and REST view and tag library (Django REST framework, drf-spectacular) cost each start
    # a third of a second of CPU. The URL conf loads off the event loop on the first request
    # that needs it (iop_site.asgi).
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--config", help="config file to make the active revision (config as code)"
        )
        parser.add_argument("--edge-id", help="this Edge's id (default: IOP_EDGE_ID)")
        for role, what in (
            ("edge", "Node websocket"),
            ("openai", "public API"),
            ("admin", "control"),
        ):
            parser.add_argument(
                f"--{role}-listen",
                metavar="HOST:PORT",
                help=f"{what} listener of this Edge (default: IOP_{role.upper()}_LISTEN, "
                f"else the config's {role}.listen)",
            )

    def execute(self, *args: Any, **options: Any) -> Any:
        from django.conf import settings

        try:
            return super().execute(*args, **options)
        except CommandError as exc:
            if settings.LOG_FORMAT != "json":
                raise
            # R-OBS-4: even the reason the Edge did not start is one JSON line
            logging.getLogger("iop.edge").error("%s", exc)
            sys.exit(1)

    def handle(self, *args: Any, **options: Any) -> None:
        from django.conf import settings

        self._start(settings, options)

    def _say(self, settings: Any, text: str) -> None:
        if settings.LOG_FORMAT == "json":
            logging.getLogger("iop.edge").error("%s", text)
        else:
            self.stderr.write(text)

    def _start(self, settings: Any, options: dict[str, Any]) -> None:

        from catalog.config import ConfigError
        from iop_site import scale
        from iop_site.edge_local import EdgeLocal, LocalSettingError
        from iop_site.server import ListenError, StartError, serve
        from iop_site.startup_checks import database_refusal
        from iop_site.tls import TLSFileError
        from refresh.startup import checked_start

        try:
            local = EdgeLocal.from_settings(
                settings,
                edge_id=options.get("edge_id"),
                edge_listen=options.get("edge_listen"),
                openai_listen=options.get("openai_listen"),
                admin_listen=options.get("admin_listen"),
            )
        except LocalSettingError as exc:
            raise CommandError(str(exc)) from None
        database = str(settings.DATABASES["default"]["ENGINE"])
        reason = scale.refusal(settings.IOP_SCALE, database)  # before writing any revision
        if reason is None:
            reason = database_refusal()  # R-SCALE-9: reachable and migrated, else one line
        if reason is not None:
            raise CommandError(f"cannot start: {reason}")
        if settings.IOP_SCALE.enabled:
            try:
                scale.check_redis(settings.IOP_SCALE)  # R-SCALE-9: a Redis, new enough
            except scale.ScaleOutRefused as exc:
                raise CommandError(f"cannot start: {exc}") from None
        try:
            # R-CFG-14: every check that can refuse the start runs on the snapshot the start
            # would activate, before the revision is committed; a refusal records nothing.
            start, revision = checked_start(
                options.get("config"), lambda snapshot: start_checks(local, database, snapshot)
            )
        except ConfigError as exc:
            for issue in exc.issues:
                self._say(settings, str(issue))
            raise CommandError(f"invalid config: {len(exc.issues)} error(s)") from None
        snapshot = start.snapshot
        names = " ".join(f"{it.role}={it.url()}" for it in start.endpoints.listeners)
        if snapshot.openai_tls is not None and not settings.IOP_HTTPS:
            logging.getLogger("iop.edge").warning(
                "openai.tls is on but IOP_HTTPS is not set: the admin's session and "
                "CSRF cookies are not marked Secure and no HSTS is sent (docs/configuration.md)"
            )

        def ready() -> None:  # R-TLS-1: https:// and wss://; R-OBS-4: JSON with LOG_FORMAT=json
            announce(settings.LOG_FORMAT, "iop.edge", f"IOP Edge ready: {names}", sys.stdout)

        try:
            serve(
                snapshot,
                revision=revision,
                edge_id=start.edge_id,
                endpoints=start.endpoints,
                managed_keys=start.managed_keys,
                on_ready=ready,
            )
        except (TLSFileError, scale.ScaleOutRefused, StartError) as exc:
            raise CommandError(f"cannot start: {exc}") from None
        except ListenError as exc:
            for failure in exc.failures:
                self._say(settings, failure)
            raise CommandError(
                "the Edge cannot listen (is another Edge already running on these ports? "
                "stop it, or change the listen addresses in the config)"
            ) from None


@dataclass(frozen=True)
class Start:
    """What the start's checks produced: the snapshot this process runs, its id, its
    listeners with their TLS files read, and the managed keys (read once, R-MGD-7)."""

    snapshot: Any
    edge_id: str
    endpoints: Any
    managed_keys: Any


def start_checks(local: Any, database: str, snapshot: Any) -> Start:
    """Every check that can refuse the start, on the snapshot the start would activate; a
    refusal raises CommandError (R-CFG-14)."""
    from django.conf import settings

    from iop_site import scale
    from iop_site.edge_local import LocalSettingError
    from iop_site.server import ports_in_use
    from iop_site.tls import Endpoints, TLSFileError, listeners

    try:
        snapshot = local.localize(snapshot)  # this process only: the revision is shared
    except LocalSettingError as exc:
        raise CommandError(str(exc)) from None
    edge_id = local.resolved_edge_id(snapshot)
    reason = scale.refusal(settings.IOP_SCALE, database, snapshot)
    if reason is not None:
        raise CommandError(f"cannot start: {reason}")
    if settings.IOP_SCALE.enabled:
        try:
            scale.check_edge_id_free(settings.IOP_SCALE, edge_id)
        except scale.ScaleOutRefused as exc:
            raise CommandError(f"cannot start: {exc}") from None
    managed_keys = None
    if snapshot.credential_plane is not None:  # R-MGD-4: every managed key readable
        from nodes.envelope import KeyFileError
        from pool.http.managed import ManagedKeys

        try:
            managed_keys = ManagedKeys.load(snapshot)  # R-MGD-7: the one read of the key files
        except KeyFileError as exc:
            raise CommandError(f"managed mode cannot start: {exc}") from None
    from obskit.otel import TracingConfigError, check_environment, tracing_requested

    if tracing_requested():
        try:
            check_environment()  # R-OBS-2: an OTEL_* value the Edge cannot honour
        except TracingConfigError as exc:
            raise CommandError(f"cannot start: {exc}") from None
    try:
        endpoints = Endpoints(listeners(snapshot))  # R-TLS-1: the TLS files, read now
    except TLSFileError as exc:
        raise CommandError(f"cannot start: {exc}") from None
    busy = ports_in_use(endpoints.listeners)
    if busy:
        raise CommandError(
            f"the Edge cannot listen ({'; '.join(busy)}): is another Edge already running on "
            "these ports? stop it, or change the listen addresses in the config"
        )
    return Start(snapshot, edge_id, endpoints, managed_keys)
