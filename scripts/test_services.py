"""Which real services `make test` can use, and one line about what it skips.

    eval "$(.venv/bin/python scripts/test_services.py)"   # export what answers
    echo "$IOP_TEST_SKIPPED"                               # "skipped: ..." (one line)

PostgreSQL on 127.0.0.1:5432 as user ``postgres`` and Redis on 127.0.0.1:6379 are used when
they answer within 2 s, as ``.ci/run`` does; a variable already in the environment wins, an
empty one turns its group off. Chromium is Debian's, at ``/usr/bin/chromium``
(``scripts/install-browser.sh``). README.md, "Two commands".
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

DATABASE_VAR, REDIS_VAR = "IOP_TEST_DATABASE_URL", "IOP_TEST_REDIS_URL"
DEFAULT_DATABASE = "postgresql://postgres@127.0.0.1:5432/iop"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
CHROMIUM = Path("/usr/bin/chromium")
# scripts/install-clients.sh (R-CLIENT-1): Claude Code and the Codex CLI, pinned
CLIENTS = Path(__file__).resolve().parent.parent / "var" / "clients" / "node_modules" / ".bin"
TIMEOUT_S = 2


def postgres_answers() -> bool:
    try:
        import psycopg

        url = DEFAULT_DATABASE.rsplit("/", 1)[0] + "/postgres"
        with psycopg.connect(url, connect_timeout=TIMEOUT_S):
            return True
    except Exception:  # any failure means "not usable here"; the summary says so
        return False


def redis_answers() -> bool:
    try:
        import redis

        client = redis.Redis.from_url(
            DEFAULT_REDIS, socket_connect_timeout=TIMEOUT_S, socket_timeout=TIMEOUT_S
        )
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def chosen() -> dict[str, str]:
    """The value each variable should have: the environment's when set, else a probe's."""
    out = {}
    for name, default, answers in (
        (DATABASE_VAR, DEFAULT_DATABASE, postgres_answers),
        (REDIS_VAR, DEFAULT_REDIS, redis_answers),
    ):
        if name in os.environ:
            out[name] = os.environ[name]
        else:
            out[name] = default if answers() else ""
    return out


def skipped(env: dict[str, str]) -> list[str]:
    """Each group of tests that will skip, with why."""
    out = []
    for name, group, where in (
        (DATABASE_VAR, "PostgreSQL tests", "127.0.0.1:5432 as user postgres"),
        (REDIS_VAR, "Redis tests", "127.0.0.1:6379"),
    ):
        if not env[name]:
            why = f"{name} is empty" if name in os.environ else f"nothing answers on {where}"
            out.append(f"{group} ({why})")
    if not CHROMIUM.exists():
        out.append("browser tests (chromium not installed: sudo scripts/install-browser.sh)")
    if not all((CLIENTS / name).exists() for name in ("claude", "codex")):
        out.append(
            "coding-agent CLI tests (not installed: scripts/install-clients.sh needs node and "
            "npm; their recorded requests still run)"
        )
    return out


def main(argv: list[str]) -> int:
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    env = chosen()
    for name, value in env.items():
        print(f"export {name}={shlex.quote(value)}")
    groups = skipped(env)
    summary = "skipped: " + ("; ".join(groups) if groups else "nothing")
    print(f"IOP_TEST_SKIPPED={shlex.quote(summary)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
