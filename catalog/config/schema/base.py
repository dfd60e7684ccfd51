"""Shared pydantic pieces: the strict base model, field types, and error-to-issue conversion."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator as After
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from catalog.config.addresses import is_loopback_host, parse_host_port, url_problem
from catalog.config.errors import ConfigIssue, Issues, format_path
from catalog.config.money import MAX_AMOUNT, MAX_PRICE, MoneyError, decimal_figure

M = TypeVar("M", bound=BaseModel)


class Doc(BaseModel):
    """A config section: unknown keys are errors and values are not coerced (no "5" for 5)."""

    model_config = ConfigDict(extra="forbid", strict=True)


def fail(message: str) -> PydanticCustomError:
    """A validation error whose message is shown as written (it must never echo a secret)."""
    return PydanticCustomError("config", message)


def matching(pattern: str, message: str) -> Any:
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise fail(message)
        return value

    return After(check)


def _listen(value: str) -> str:
    try:
        return str(parse_host_port(value))
    except ValueError as exc:
        raise fail(str(exc)) from None


def _loopback_listen(value: str) -> str:
    normalized = _listen(value)
    if not is_loopback_host(parse_host_port(normalized).host):
        raise fail("must be a loopback address (127.0.0.0/8, ::1 or localhost)")
    return normalized


def _http_url(value: str) -> str:
    problem = url_problem(value)
    if problem:
        raise fail(problem)
    return value


def _file_ref(value: str) -> str:
    # R-AUTH-4: key material is always an external file reference, never inline PEM.
    if "-----BEGIN" in value or "\n" in value:
        raise fail("must be a file path; inline key or certificate material is not allowed")
    return value


def _json_value(value: Any) -> Any:
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list):
        return [_json_value(item) for item in value]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: _json_value(item) for key, item in value.items()}
    raise fail("must hold only JSON values (strings, numbers, booleans, null, lists, mappings)")


NonEmpty = Annotated[str, Field(min_length=1)]
# Length bounds match the catalog's columns, so whatever loads can also be stored.
Identifier = Annotated[
    str,
    Field(min_length=1, max_length=100),
    matching(r"[A-Za-z0-9][A-Za-z0-9._-]*", "must be letters, digits, '.', '_' or '-'"),
]
Label = Annotated[
    str, Field(min_length=1, max_length=200), matching(r"[^\x00-\x1f\x7f]+", "must be printable")
]
ModelId = Annotated[
    str, Field(min_length=1, max_length=200), matching(r"\S+", "must not contain whitespace")
]
Sha256Hex = Annotated[
    str, matching(r"[0-9a-f]{64}", "must be 64 lowercase hex characters (a sha256 digest)")
]
HeaderName = Annotated[
    str, matching(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", "must be an HTTP header name (RFC 9110 token)")
]
EnvName = Annotated[
    str, matching(r"[A-Za-z_][A-Za-z0-9_]*", "must be an environment variable name")
]
Listen = Annotated[str, After(_listen)]
LoopbackListen = Annotated[str, After(_loopback_listen)]
HttpUrl = Annotated[str, Field(max_length=500), After(_http_url)]
FileRef = Annotated[str, Field(min_length=1), After(_file_ref)]
JsonObject = Annotated[dict[str, Any], After(_json_value)]


def _figure(maximum: Decimal) -> Any:
    def read(value: Any) -> Decimal:
        try:
            return decimal_figure(value, maximum)
        except MoneyError as exc:
            raise fail(str(exc)) from None

    return BeforeValidator(read)


def _money_json(value: Decimal) -> int | float:
    # A JSON number, read back exactly: at most 6 places and 10^9 fit a double's 15 digits.
    return int(value) if value == value.to_integral_value() else float(value)


_AS_NUMBER = PlainSerializer(_money_json, when_used="json")
# R-COST-1: a price per million tokens; R-COST-3: a budget amount (catalog/config/money.py)
Price = Annotated[Decimal, _figure(MAX_PRICE), _AS_NUMBER]
Amount = Annotated[Decimal, _figure(MAX_AMOUNT), Field(gt=0), _AS_NUMBER]


class SecretRefDoc(Doc):
    """``{env: NAME}`` or ``{file: PATH}``; exactly one."""

    env: EnvName | None = None
    file: FileRef | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRefDoc:
        if (self.env is None) == (self.file is None):
            raise fail("a secret reference needs exactly one of env or file")
        return self


def _secret_shape(value: Any) -> Any:
    # Never echo the value: a literal here is very likely the secret itself.
    if not isinstance(value, Mapping):
        raise fail("must be a secret reference {env: NAME} or {file: PATH}; literals not allowed")
    return value


Secret = Annotated[SecretRefDoc, BeforeValidator(_secret_shape)]

_MESSAGES = {
    "missing": "is required",
    "extra_forbidden": "unknown key",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "mapping_type": "must be a mapping",
    "list_type": "must be a list",
}


def _message(error: Mapping[str, Any]) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind in _MESSAGES:
        return _MESSAGES[kind]
    bounds = {"greater_than_equal": ">=", "less_than_equal": "<=", "greater_than": ">"}
    if kind in bounds:
        limit = ctx.get({">=": "ge", "<=": "le", ">": "gt"}[bounds[kind]])
        return f"must be {bounds[kind]} {limit}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    if kind in ("string_too_short", "too_short"):
        return "must not be empty" if ctx.get("min_length") == 1 else str(error["msg"])
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    return str(error["msg"])


def issues_from(exc: ValidationError, prefix: Sequence[str | int]) -> list[ConfigIssue]:
    """Convert pydantic errors to issues at ``prefix + loc`` (input values are never shown)."""
    out = []
    for error in exc.errors(include_url=False, include_input=False):
        loc = [part for part in error["loc"] if part != "[key]"]
        out.append(ConfigIssue(format_path([*prefix, *loc]), _message(error)))
    return out


def validate_into(
    model: type[M], raw: Any, prefix: Sequence[str | int], issues: Issues
) -> M | None:
    """Validate ``raw`` as ``model``; on failure record the issues and return None."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        issues.extend(issues_from(exc, prefix))
        return None
