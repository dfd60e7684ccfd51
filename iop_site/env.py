"""Small typed readers for the environment that fail loudly (docs/architecture.md)."""

from __future__ import annotations

import os
import re
import secrets
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}: expected a boolean (1/0, true/false), got {raw!r}")


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}: expected a number, got {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}: must be >= {minimum}, got {value}")
    return value


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}: expected a whole number, got {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}: must be >= {minimum}, got {value}")
    return value


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def env_log_level(name: str = "LOG_LEVEL", default: str = "INFO") -> str:
    """One of ``LOG_LEVELS``, in any case; anything else stops the start naming the values."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().upper()
    if value not in LOG_LEVELS:
        raise ImproperlyConfigured(f"{name}: one of {', '.join(LOG_LEVELS)}, got {raw!r}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_match(name: str, pattern: str, what: str) -> str | None:
    """NAME when it is set and fully matches ``pattern``; None when unset or empty."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if not re.fullmatch(pattern, raw):
        raise ImproperlyConfigured(f"{name}: must be {what}, got {raw!r}")
    return raw


def env_listen(name: str) -> str | None:
    """A ``HOST:PORT`` listen address (IPv6 as ``[addr]:port``), or None when unset."""
    from catalog.config.addresses import parse_host_port

    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return str(parse_host_port(raw))
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: {exc}, got {raw!r}") from None


def env_secret(name: str, fallback_file: Path) -> str:
    """NAME, else the file named by NAME_FILE, else a value generated once into fallback_file."""
    value = os.environ.get(name)
    if value:
        return value
    file_name = os.environ.get(f"{name}_FILE")
    if file_name:
        try:
            value = Path(file_name).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(
                f"{name}_FILE: cannot read {file_name}: {exc.strerror}"
            ) from exc
        if not value:
            raise ImproperlyConfigured(f"{name}_FILE: {file_name} is empty")
        return value
    if fallback_file.exists():
        return fallback_file.read_text().strip()
    fallback_file.parent.mkdir(parents=True, exist_ok=True)
    # Written whole under a private name, then linked into place: processes starting at
    # once (an Edge and a command, parallel test workers) all end up with the first value
    # linked, and none reads a file another is still writing.
    fd, draft = tempfile.mkstemp(prefix=f".{fallback_file.name}.", dir=fallback_file.parent)
    with os.fdopen(fd, "w") as handle:  # mkstemp: mode 0600
        handle.write(secrets.token_urlsafe(50))
    try:
        os.link(draft, fallback_file)
    except FileExistsError:
        pass  # another process linked its value first: that one is the value
    finally:
        os.unlink(draft)
    return fallback_file.read_text().strip()


def database_from_url(url: str, base_dir: Path) -> dict[str, object]:
    """DATABASE_URL (postgresql://, sqlite:///path) as a Django DATABASES entry."""
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        path = unquote(parsed.path)
        if path.startswith("/") and parsed.netloc == "":
            path = path[1:] if path.startswith("//") else path
        name = Path(path) if Path(path).is_absolute() else base_dir / path.lstrip("/")
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(name)}
    if parsed.scheme in {"postgres", "postgresql"}:
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parsed.path.lstrip("/")),
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(parsed.port or ""),
        }
    raise ImproperlyConfigured(
        f"DATABASE_URL: unsupported scheme {parsed.scheme!r} (use postgresql:// or sqlite:///)"
    )
