"""Log lines of both sides: human (the default) or one JSON object a line (R-OBS-4).

``LOG_FORMAT=json`` makes every line a process writes one JSON object with ``time``,
``level``, ``logger``, ``message`` and the request context of ``obskit.context``; Python
warnings and the ready line go the same way, so a log shipper never meets plain text.
The formatter is the standard library's ``json`` over a fixed set of fields: a dependency
for it would add weight to every Node install for a few lines.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any, TextIO

from obskit.context import FIELDS, LogContext

LOG_FORMATS = ("human", "json")
HUMAN_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s%(context)s"


class LogFormatError(ValueError):
    """LOG_FORMAT names no known format."""


def log_format(environ: Mapping[str, str]) -> str:
    """``LOG_FORMAT`` from ``environ``: human (default) or json; anything else is refused."""
    value = environ.get("LOG_FORMAT", "").strip().lower() or "human"
    if value not in LOG_FORMATS:
        raise LogFormatError(f"LOG_FORMAT: {value[:40]!r} is not one of human, json")
    return value


def printable(text: str, limit: int = 300) -> str:
    """A peer's text fit for one log line (R-TLS-9): at most ``limit`` characters, and, when
    it holds anything a line reader could take for another line or a control (a newline, a
    terminal escape), its ``repr`` instead, so a forged line stays inside this one."""
    clipped = text[:limit]
    return clipped if clipped.isprintable() else repr(clipped)


# The project's own packages: a fault is placed at its innermost frame in one of them.
OWN_PACKAGES = frozenset(
    {"catalog", "edgekit", "iop_site", "nodes", "obskit", "pool", "refresh", "secretref"}
)
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def fault(exc_info: ExcInfo | tuple[None, None, None]) -> str:
    """An exception as one line with neither its text nor a traceback (either may carry a
    secret or a peer's bytes): its type, the innermost frame of the project's own code it
    passed through, and the type of the exception it was raised while handling. ``KeyError
    (nodes.remote.open_run, line 216) while handling ConnectionError``."""
    kind, value, tb = exc_info
    if kind is None or value is None:
        return ""
    own = last = ""
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", "?"))
        last = f"{module}.{tb.tb_frame.f_code.co_name}, line {tb.tb_lineno}"
        if module.partition(".")[0] in OWN_PACKAGES:
            own = last
        tb = tb.tb_next
    where = own or last
    text = kind.__name__ + (f" ({where})" if where else "")
    earlier = value.__cause__ or (None if value.__suppress_context__ else value.__context__)
    return text + (f" while handling {type(earlier).__name__}" if earlier is not None else "")


def _iso(created: float) -> str:
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def json_line(level: str, logger: str, message: str, **context: Any) -> str:
    """One log line as JSON: the fixed fields, then the context (``None`` when unset)."""
    line: dict[str, Any] = {
        "time": _iso(time.time()), "level": level, "logger": logger, "message": message,
    }  # fmt: skip
    for name in FIELDS:
        line[name] = context.get(name) or None
    return json.dumps(line, ensure_ascii=True)


class JsonFormatter(logging.Formatter):
    """One JSON object a line (R-OBS-4); an exception goes in ``exception`` as one line
    (``fault``: never its text or a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            line[name] = getattr(record, name, "") or None
        if record.exc_info and (said := fault(record.exc_info)):
            line["exception"] = said
        return json.dumps(line, ensure_ascii=True, default=str)


class HumanFormatter(logging.Formatter):
    """The plain line, with ``[request_id=... run_id=...]`` when a request is in context;
    an exception follows the message on the same line, as ``fault`` puts it (never its text
    or a traceback)."""

    def __init__(self) -> None:
        super().__init__(HUMAN_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        parts = [f"{name}={value}" for name in FIELDS if (value := getattr(record, name, ""))]
        said = fault(record.exc_info) if record.exc_info else ""
        record.context = (f": {said}" if said else "") + (f" [{' '.join(parts)}]" if parts else "")
        held = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None  # not the default's lines
        try:
            return super().format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = held


def formatter(fmt: str) -> logging.Formatter:
    return JsonFormatter() if fmt == "json" else HumanFormatter()


def handler(fmt: str, stream: TextIO | None = None) -> logging.Handler:
    """A stream handler with the context filter and the format's formatter."""
    out = logging.StreamHandler(stream if stream is not None else sys.stderr)
    out.addFilter(LogContext())
    out.setFormatter(formatter(fmt))
    return out


def capture_everything(fmt: str) -> None:
    """In JSON mode, Python warnings and uncaught exceptions become log records too."""
    if fmt != "json":
        return
    logging.captureWarnings(True)

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        logging.getLogger("uncaught").critical("uncaught exception", exc_info=(kind, value, tb))

    sys.excepthook = hook


def configure(fmt: str, level: str, stream: TextIO | None = None) -> None:
    """The root logger of a process that is not Django (the Node agent); like
    ``logging.basicConfig``, it leaves a root logger that already has handlers alone."""
    root = logging.getLogger()
    if root.handlers:
        return
    root.addHandler(handler(fmt, stream))
    root.setLevel(level.upper())
    capture_everything(fmt)


def announce(fmt: str, logger: str, message: str, stream: TextIO | None = None) -> None:
    """A line a process always writes whatever the log level (the ready line): plain text,
    or one JSON object in JSON mode."""
    out = stream if stream is not None else sys.stdout
    out.write((json_line("INFO", logger, message) if fmt == "json" else message) + "\n")
    out.flush()
