"""What stops an Edge at start before anything listens (R-SCALE-9, docs/scale-out.md "Start
refusals"): a database that does not answer or is not migrated. One line that says what to
do; never a traceback. (Redis: ``iop_site.scale.check_redis``.)"""

from __future__ import annotations

MAX_REASON_CHARS = 200
CONNECT_TIMEOUT_S = 10  # the check's own bound: a port that is not PostgreSQL never answers


def database_refusal() -> str | None:
    """Why the Edge cannot use the database of ``DATABASE_URL``, or None."""
    from django.db import DatabaseError, connection
    from django.db.migrations.executor import MigrationExecutor

    options = connection.settings_dict.setdefault("OPTIONS", {})
    saved = dict(options)
    opened_here = connection.connection is None  # a caller's open connection stays open
    if connection.vendor == "postgresql":
        options.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    try:
        connection.ensure_connection()
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except DatabaseError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:MAX_REASON_CHARS]
        if "timeout" in first:
            return (
                f"the database of DATABASE_URL did not answer within {CONNECT_TIMEOUT_S} s: is "
                "that address a PostgreSQL server? check DATABASE_URL"
            )
        return (
            f"the database of DATABASE_URL does not answer ({first}): start it, or check "
            "DATABASE_URL"
        )
    finally:
        if opened_here:
            connection.close()
        options.clear()
        options.update(saved)  # the Edge's own connections keep the configured options
    if plan:
        return (
            f"the database of DATABASE_URL is not migrated ({len(plan)} migration(s) to apply): "
            "run `python manage.py migrate` with the same DATABASE_URL, then start again"
        )
    return None
