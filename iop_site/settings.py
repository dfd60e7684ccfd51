"""IOP Edge settings: one module, everything from the environment (see iop_site.env)."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from iop_site.edge_local import EDGE_ID_PATTERN, EDGE_ID_WHAT
from iop_site.env import (
    database_from_url,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_listen,
    env_log_level,
    env_match,
    env_secret,
)
from iop_site.scale import ScaleSettings
from obskit.logs import LogFormatError, capture_everything, log_format

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("IOP_VAR_DIR", BASE_DIR / "var"))

SECRET_KEY = env_secret("SECRET_KEY", VAR_DIR / "secret_key")
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])

# No "daphne" app: the Edge runs under `manage.py runedge`, which imports daphne.server (and
# so installs Twisted's asyncio reactor) before it starts listening; as an app it only swaps
# `runserver` for daphne's and costs every other command (a migrate, an iop_* command) the
# import of daphne and Twisted, about a third of a second of CPU.
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "channels",
    "axes",
    "iop_site",
    "catalog",
    "pool",
    "refresh",
    "nodes",
]

MIDDLEWARE = [
    # R-HA-3: PostgreSQL gone is a 503 with one sentence (docs/scale-out.md), before sessions.
    "iop_site.database_gone.DatabaseGoneMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it turns a lockout into a 429 answer.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "iop_site.urls"
ASGI_APPLICATION = "iop_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": database_from_url(
        os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'iop.sqlite3'}"), BASE_DIR
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # WAL: readers never wait for the writer. IMMEDIATE: a transaction takes the write lock
    # when it begins, so two writers queue (up to the timeout) instead of one failing with
    # "database is locked" when it upgrades a read (docs/refresh.md, "The database").
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
    }

# No CHANNEL_LAYERS: the Node consumer uses no channel layer (docs/architecture.md).

# Admin login throttling (django-axes, docs/admin.md): after
# IOP_ADMIN_LOGIN_FAILURE_LIMIT failed logins from one client address, that address is
# refused (429) for IOP_ADMIN_LOGIN_COOLOFF_S; a successful login resets its count.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out client before any check
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("IOP_ADMIN_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(seconds=env_float("IOP_ADMIN_LOGIN_COOLOFF_S", 900.0, minimum=1.0))
AXES_LOCKOUT_PARAMETERS = ["ip_address"]  # the socket peer address (REMOTE_ADDR) only
AXES_RESET_ON_SUCCESS = True
AXES_DISABLE_ACCESS_LOG = True  # no row per successful login: the table would only grow
AXES_HTTP_RESPONSE_CODE = 429

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAdminUser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "IOP Edge API",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema maps the whole API surface: staff only, like the API itself.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAdminUser"],
}

# Where the Edge reads its config when no revision is active yet (runedge --config overrides).
IOP_CONFIG_FILE = os.environ.get("IOP_CONFIG_FILE", str(BASE_DIR / "configs" / "edge.yaml"))

# Per Edge, beside the shared config document (docs/configuration.md, "Per Edge"): this
# Edge's id and listen addresses; runedge's --edge-id / --*-listen flags win over these.
IOP_EDGE_ID = env_match("IOP_EDGE_ID", EDGE_ID_PATTERN, EDGE_ID_WHAT)
IOP_EDGE_LISTEN = env_listen("IOP_EDGE_LISTEN")
IOP_OPENAI_LISTEN = env_listen("IOP_OPENAI_LISTEN")
IOP_ADMIN_LISTEN = env_listen("IOP_ADMIN_LISTEN")

# Scale-out (several Edges on one PostgreSQL and one Redis, R-SCALE-2): on when IOP_REDIS_URL
# is set; read once here (iop_site.scale.ScaleSettings, docs/configuration.md).
IOP_SCALE = ScaleSettings.from_env()

# Edge -> Node heartbeats: a ping every interval; a Node silent for the timeout is gone.
IOP_NODE_HEARTBEAT_INTERVAL_S = env_float("IOP_NODE_HEARTBEAT_INTERVAL_S", 15.0, minimum=0.05)
IOP_NODE_HEARTBEAT_TIMEOUT_S = env_float("IOP_NODE_HEARTBEAT_TIMEOUT_S", 45.0, minimum=0.1)

# Days of hourly usage rows the meter keeps; 0 keeps them all (docs/metering.md).
IOP_USAGE_RETENTION_DAYS = env_int("IOP_USAGE_RETENTION_DAYS", 90)

# Days of per-request rows (the request log, found by request id) the meter keeps; 0 keeps
# them all (docs/observability.md).
IOP_REQUEST_LOG_RETENTION_DAYS = env_int("IOP_REQUEST_LOG_RETENTION_DAYS", 7)

# Principal tokens' rpm / tpm count per window of this many seconds (R-PRIN-2; docs/http-api.md).
IOP_RATE_LIMIT_WINDOW_S = env_float("IOP_RATE_LIMIT_WINDOW_S", 60.0, minimum=0.05)

# On SIGTERM/SIGINT the Edge stops taking requests and waits this long for running ones.
IOP_SHUTDOWN_GRACE_S = env_float("IOP_SHUTDOWN_GRACE_S", 20.0)

# The admin UI behind TLS (openai.tls): IOP_HTTPS=1 makes the session and CSRF cookies
# secure, sends HSTS and redirects any plain request; `manage.py check --deploy` then
# passes (docs/configuration.md, "TLS").
IOP_HTTPS = env_bool("IOP_HTTPS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SECURE_SSL_REDIRECT = IOP_HTTPS
SECURE_HSTS_SECONDS = int(env_float("IOP_HSTS_SECONDS", 31_536_000 if IOP_HTTPS else 0))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("IOP_HSTS_INCLUDE_SUBDOMAINS", IOP_HTTPS)
SECURE_HSTS_PRELOAD = env_bool("IOP_HSTS_PRELOAD", False)
# Preloading is a promise about a whole domain that only its owner can make: opt-in.
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]

# Logs (docs/observability.md, R-OBS-4): LOG_FORMAT=human (default) or json, one JSON object a
# line with the request context; IOP_ACCESS_LOG=1 adds one line per /v1 request.
try:
    LOG_FORMAT = log_format(os.environ)
except LogFormatError as exc:
    raise ImproperlyConfigured(str(exc)) from None
IOP_ACCESS_LOG = env_bool("IOP_ACCESS_LOG", False)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "obskit.context.LogContext"}},
    "formatters": {
        "line": {
            "()": "obskit.logs.JsonFormatter"
            if LOG_FORMAT == "json"
            else "obskit.logs.HumanFormatter"
        }
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "line", "filters": ["context"]}
    },
    "root": {"handlers": ["console"], "level": env_log_level("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        "twisted": {"level": "WARNING"},  # Twisted's own log, routed here (iop_site/server.py)
        "axes.apps": {"level": "WARNING"},  # its version banner at every start
        "iop.access": {"level": "INFO" if IOP_ACCESS_LOG else "WARNING"},
    },
}
capture_everything(LOG_FORMAT)
