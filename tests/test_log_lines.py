"""R-OBS-4: log lines in human or JSON form, with the request context from contextvars."""

from __future__ import annotations

import contextvars
import io
import json
import logging
from collections.abc import Callable

import pytest

from obskit import context
from obskit.context import LogContext, request_id_from, traceparent_from
from obskit.logs import HumanFormatter, JsonFormatter, LogFormatError, announce, log_format

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def logged(formatter: logging.Formatter, emit: Callable[[logging.Logger], None]) -> str:
    """What ``emit`` logs, as ``formatter`` writes it through a handler with the context."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(LogContext())
    handler.setFormatter(formatter)
    logger = logging.getLogger("iop.test.lines")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        emit(logger)
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    return stream.getvalue()


def line(formatter: logging.Formatter, message: str = "hello %s", *args: object) -> str:
    return logged(formatter, lambda logger: logger.warning(message, *args))


def in_request(fn, **values: str):  # type: ignore[no-untyped-def]
    """Run ``fn`` in a context that has the given request context set."""

    def run():  # type: ignore[no-untyped-def]
        for name, value in values.items():
            getattr(context, name.upper()).set(value)
        return fn()

    return contextvars.copy_context().run(run)


def test_a_json_line_has_every_field_and_the_request_context_r_obs_4() -> None:
    """R-OBS-4: one JSON object with time, level, logger, message and the five context fields."""
    text = in_request(
        lambda: line(JsonFormatter(), "run %s failed", "r1"),
        request_id="req-1", run_id="r1", trace_id="abc", node="node-1", provider="p1",
    )  # fmt: skip
    assert text.count("\n") == 1
    obj = json.loads(text)
    assert obj["level"] == "WARNING" and obj["logger"] == "iop.test.lines"
    assert obj["message"] == "run r1 failed" and obj["time"].endswith("Z")
    assert (obj["request_id"], obj["run_id"], obj["trace_id"], obj["node"], obj["provider"]) == (
        "req-1", "r1", "abc", "node-1", "p1",
    )  # fmt: skip


def test_outside_a_request_the_context_fields_are_null() -> None:
    obj = json.loads(line(JsonFormatter()))
    assert obj["request_id"] is None and obj["provider"] is None


def test_a_message_with_newlines_and_quotes_stays_one_line() -> None:
    text = line(JsonFormatter(), 'two\nlines "quoted" \u2028')
    assert text.count("\n") == 1
    assert json.loads(text)["message"] == 'two\nlines "quoted" \u2028'


def test_the_human_line_names_the_request_only_when_there_is_one() -> None:
    assert "[" not in line(HumanFormatter(), "plain")
    text = in_request(lambda: line(HumanFormatter(), "x"), request_id="req-9", run_id="r9")
    assert text.rstrip().endswith("x [request_id=req-9 run_id=r9]")


def test_log_format_defaults_to_human_and_refuses_unknown_names() -> None:
    """R-OBS-4: the default stays human; an unknown LOG_FORMAT is refused with its name."""
    assert log_format({}) == "human"
    assert log_format({"LOG_FORMAT": " JSON "}) == "json"
    with pytest.raises(LogFormatError, match="LOG_FORMAT"):
        log_format({"LOG_FORMAT": "xml"})


def test_the_ready_line_is_json_in_json_mode() -> None:
    out = io.StringIO()
    announce("json", "iop.edge", "IOP Edge ready: openai=http://x", out)
    assert json.loads(out.getvalue())["message"] == "IOP Edge ready: openai=http://x"
    out = io.StringIO()
    announce("human", "iop.edge", "IOP Edge ready: openai=http://x", out)
    assert out.getvalue() == "IOP Edge ready: openai=http://x\n"


@pytest.mark.parametrize(
    "raw",
    [b"x" * 10_000, b"has space", b"bell\x07", b"x" * 129, b"", b"semi;colon", "\u00e9".encode()],
)
def test_an_odd_request_id_is_replaced_r_obs_1(raw: bytes) -> None:
    """R-OBS-1: only 1..128 characters of [A-Za-z0-9._:-] are kept."""
    made = request_id_from(raw)
    assert made != raw.decode(errors="replace") and len(made) == 24


def test_a_good_request_id_is_kept() -> None:
    assert request_id_from(b"abc-DEF_1.2:3") == "abc-DEF_1.2:3"
    assert request_id_from(b"a" * 128) == "a" * 128
    assert request_id_from(None) != request_id_from(None)


@pytest.mark.parametrize(
    "raw",
    [
        "00-xyz-00f067aa0ba902b7-01",
        TRACEPARENT + "-" + "a" * 4000,
        TRACEPARENT.upper(),
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",
        "ff" + TRACEPARENT[2:],
        " " + TRACEPARENT[1:],
    ],
    ids=["malformed", "too-long", "upper", "zero-trace", "zero-span", "version-ff", "space"],
)
def test_a_bad_traceparent_is_ignored_r_obs_2(raw: str) -> None:
    """R-OBS-2: malformed, too long or invalid trace context is dropped (a new trace starts)."""
    assert traceparent_from(raw) == ""
    assert traceparent_from(raw.encode()) == ""


def test_a_good_traceparent_is_kept() -> None:
    assert traceparent_from(TRACEPARENT) == TRACEPARENT
    assert traceparent_from(TRACEPARENT.encode()) == TRACEPARENT


def test_twisteds_own_log_goes_through_the_standard_logging_r_obs_4(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """R-OBS-4: a Twisted warning (daphne would drop it) becomes a record of logger
    ``twisted``, so it is written in the Edge's format like every other line."""
    import daphne.server  # noqa: F401  (the asyncio reactor first, as the Edge does)
    from twisted.logger import Logger, globalLogPublisher

    from iop_site.edge_server import route_twisted_log

    observer = route_twisted_log()
    try:
        with caplog.at_level(logging.WARNING, logger="twisted"):
            Logger(namespace="twisted.web.http").warn("connection lost oddly: {why}", why="x")
    finally:
        globalLogPublisher.removeObserver(observer)
    (record,) = [r for r in caplog.records if r.name == "twisted"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == "connection lost oddly: x"


def failed_line(formatter: logging.Formatter) -> str:
    """A line logged with ``log.exception`` while handling an error raised inside the
    project's own code (``log_format`` refuses a value, naming it) during another one."""

    def emit(logger: logging.Logger) -> None:
        try:
            try:
                raise ConnectionError("a peer's text")
            except ConnectionError:
                log_format({"LOG_FORMAT": "secret-value"})
        except LogFormatError:
            logger.exception("request failed inside the Edge")

    return logged(formatter, emit)


@pytest.mark.parametrize("formatter", [HumanFormatter, JsonFormatter])
def test_an_exception_is_one_line_with_its_type_and_place_never_its_text_or_trace(
    formatter: type[logging.Formatter],
) -> None:
    """No stack trace and no exception text in a log line (a secret or a peer's bytes may be
    in either): the type, the innermost frame of the project's own code, what it was
    handling."""
    text = failed_line(formatter())
    assert text.count("\n") == 1 and "Traceback" not in text
    assert "secret-value" not in text and "a peer's text" not in text
    human = formatter is HumanFormatter
    said = text.rstrip("\n") if human else json.loads(text)["exception"]
    assert "LogFormatError (obskit.logs.log_format, line " in said
    assert said.endswith(") while handling ConnectionError")
    if human:  # on the message's own line
        assert "request failed inside the Edge: LogFormatError (obskit.logs.log_format" in said


@pytest.mark.parametrize("formatter", [HumanFormatter, JsonFormatter])
def test_exc_info_asked_outside_a_handler_adds_nothing(formatter: type[logging.Formatter]) -> None:
    """``exc_info=True`` with no exception being handled: the line stays as it is."""
    text = logged(formatter(), lambda logger: logger.error("nothing failed", exc_info=True))
    if formatter is HumanFormatter:
        assert text.endswith(" nothing failed\n")
    else:
        assert "exception" not in json.loads(text)
