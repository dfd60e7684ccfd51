"""node.yaml: load, validate, report every error with its path (R-AUTH-4).

Keys: node_id, edge_url or edge_urls [...] (exactly one; docs/node.md, "Several Edges"),
token ({env}|{file}), tls {ca_file, cert_file, key_file},
allow_plaintext, policy {...} (nodes.agent.policy), limits {...} (nodes.agent.limits),
credential_plane {...}.
Unknown keys are rejected; a literal token is rejected; relative file paths are read
relative to the config file's directory.
"""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from nodes.agent.limits import DEFAULT_LIMITS, Limits
from nodes.agent.policy import NodePolicy
from nodes.wire import SecretRefPayload

MAX_REPLAY_CACHE = 1_000_000


class NodeConfigError(ValueError):
    """The config file is invalid; ``errors`` lists every problem as ``path: message``."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("invalid node config:\n  " + "\n  ".join(errors))


def _file_ref(value: str, info: ValidationInfo) -> str:
    """A key/cert value must be a path to an existing file, never inline material."""
    if "\n" in value or value.lstrip().startswith("-----BEGIN"):
        raise ValueError("must be a file path, not inline key material")
    base = Path((info.context or {}).get("base_dir", "."))
    path = (base / Path(value).expanduser()).resolve()
    if not path.is_file():
        raise ValueError(f"file not found: {value}")
    return str(path)


_NonEmpty = Annotated[str, Field(strict=True, min_length=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TokenRef(_Strict):
    """The node token, by reference only."""

    env: _NonEmpty | None = None
    file: _NonEmpty | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> TokenRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("set exactly one of env or file")
        return self

    @field_validator("file")
    @classmethod
    def _relative_to_config(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        base = Path((info.context or {}).get("base_dir", "."))
        return str((base / Path(value).expanduser()).resolve())

    def as_secret_ref(self) -> SecretRefPayload:
        return SecretRefPayload(env=self.env, file=self.file)


class TlsConfig(_Strict):
    """R-TLS-2: the CA to verify the Edge against (else the system store), and the client
    certificate to present when the Edge requires mutual TLS."""

    ca_file: _NonEmpty | None = None
    cert_file: _NonEmpty | None = None
    key_file: _NonEmpty | None = None

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _is_file(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else _file_ref(value, info)

    @model_validator(mode="after")
    def _usable(self) -> TlsConfig:
        """Checked at load, so a bad file is a config error, not a retry loop."""
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("set cert_file and key_file together")
        context = ssl.create_default_context()
        try:
            if self.ca_file is not None:
                context.load_verify_locations(cafile=self.ca_file)
        except (ssl.SSLError, OSError):
            raise ValueError(f"ca_file: {self.ca_file} holds no PEM certificate") from None
        try:
            if self.cert_file is not None and self.key_file is not None:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError):
            raise ValueError(
                f"cert_file {self.cert_file} and key_file {self.key_file} are not a PEM "
                "certificate and its unencrypted key"
            ) from None
        return self


class CredentialPlane(_Strict):
    """Managed credential mode (R-AUTH-4): all four keys plus a bounded replay cache."""

    recipient_key_id: _NonEmpty
    recipient_private_key_file: _NonEmpty
    issuer_key_id: _NonEmpty
    issuer_public_key_file: _NonEmpty
    replay_cache_size: Annotated[int, Field(strict=True, ge=1, le=MAX_REPLAY_CACHE)]

    @field_validator("recipient_private_key_file", "issuer_public_key_file")
    @classmethod
    def _key_is_file(cls, value: str, info: ValidationInfo) -> str:
        return _file_ref(value, info)


def _websocket_url(value: str) -> str:
    if not value.startswith(("ws://", "wss://")):
        raise ValueError("must start with ws:// or wss://")
    if not urlsplit(value).path.endswith("/ws/node"):
        raise ValueError("the path must end in /ws/node (ws://EDGE_HOST:PORT/ws/node)")
    return value


_EdgeUrl = Annotated[str, Field(strict=True, min_length=1), AfterValidator(_websocket_url)]


class NodeConfig(_Strict):
    node_id: Annotated[str, Field(strict=True, min_length=1, pattern=r"^\S+$")]
    edge_url: _EdgeUrl | None = None
    # Several Edges (R-SCALE-3): tried in turn when the connection is lost.
    edge_urls: Annotated[list[_EdgeUrl], Field(min_length=1, max_length=64)] | None = None
    token: TokenRef
    tls: TlsConfig | None = None
    allow_plaintext: Annotated[bool, Field(strict=True)] = False
    policy: NodePolicy | None = None
    limits: Limits = DEFAULT_LIMITS
    credential_plane: CredentialPlane | None = None

    @property
    def urls(self) -> tuple[str, ...]:
        """The Edges to dial, in order: ``edge_urls``, or the one ``edge_url``."""
        if self.edge_urls:
            return tuple(self.edge_urls)
        assert self.edge_url is not None  # parse_config checks exactly one is given
        return (self.edge_url,)

    @field_validator("token", mode="before")
    @classmethod
    def _no_literal_token(cls, value: Any) -> Any:
        if isinstance(value, str):
            # Never echo the value: it may be the raw token.
            raise ValueError("must be a reference {env: NAME} or {file: PATH}, not a literal")
        return value


_MESSAGES: dict[str, Callable[[dict[str, Any]], str]] = {
    "missing": lambda ctx: "is required",
    "extra_forbidden": lambda ctx: "unknown key",
    "less_than_equal": lambda ctx: f"must be <= {ctx['le']}",
    "greater_than_equal": lambda ctx: f"must be >= {ctx['ge']}",
    "int_type": lambda ctx: "must be an integer",
    "greater_than": lambda ctx: f"must be > {ctx['gt']:g}",
    "float_type": lambda ctx: "must be a number",
    "string_type": lambda ctx: "must be a string",
    "bool_type": lambda ctx: "must be true or false",
    "list_type": lambda ctx: "must be a list",
    "too_short": lambda ctx: f"must have at least {ctx['min_length']} item(s)",
    "too_long": lambda ctx: f"must have at most {ctx['max_length']} item(s)",
    "string_too_short": lambda ctx: "must not be empty",
    "string_pattern_mismatch": lambda ctx: "must not contain whitespace",
    "model_type": lambda ctx: "must be a mapping",
    "model_attributes_type": lambda ctx: "must be a mapping",
    "value_error": lambda ctx: str(ctx["error"]),
}


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"


def _format(exc: ValidationError) -> list[str]:
    errors = []
    for err in exc.errors(include_input=False, include_url=False):
        render = _MESSAGES.get(err["type"])
        message = render(err.get("ctx", {})) if render else err["msg"]
        errors.append(f"{_path(err['loc'])}: {message}")
    return errors


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _given_urls(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """(path, value) of every Edge URL the document gives."""
    urls = data.get("edge_urls")
    listed = list(enumerate(urls)) if isinstance(urls, list) else []
    single = [("edge_url", data["edge_url"])] if data.get("edge_url") is not None else []
    return single + [(f"edge_urls[{index}]", url) for index, url in listed]


def _cross_checks(data: dict[str, Any]) -> list[str]:
    """Rules across keys, checked on the raw document so they join the field errors."""
    errors = []
    if data.get("edge_url") is None and data.get("edge_urls") is None:
        errors.append("edge_url: is required (or edge_urls: a list of Edge URLs)")
    elif data.get("edge_url") is not None and data.get("edge_urls") is not None:
        errors.append("edge_urls: give edge_url or edge_urls, not both")
    for path, url in _given_urls(data):
        if not isinstance(url, str):
            continue
        if url.startswith("ws://") and data.get("allow_plaintext") is not True:
            host = urlsplit(url).hostname or ""
            if not _is_loopback(host):
                errors.append(
                    f"{path}: ws:// to {host} (not loopback) sends the token and every prompt "
                    "in cleartext: use wss:// or set allow_plaintext: true (R-TLS-2)"
                )
        if data.get("credential_plane") is not None and not url.startswith("wss://"):
            errors.append(f"{path}: must use wss:// when credential_plane is set (R-AUTH-4)")
    return errors


def parse_config(data: Any, *, base_dir: Path | str = ".") -> NodeConfig:
    """Validate a parsed document; raise NodeConfigError listing every problem."""
    if not isinstance(data, dict):
        raise NodeConfigError(["(root): must be a mapping"])
    errors: list[str] = []
    config: NodeConfig | None = None
    try:
        config = NodeConfig.model_validate(data, context={"base_dir": str(base_dir)})
    except ValidationError as exc:
        errors.extend(_format(exc))
    errors.extend(_cross_checks(data))
    if errors or config is None:
        raise NodeConfigError(errors)
    return config


def load_config(path: Path | str) -> NodeConfig:
    """Read and validate node.yaml."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise NodeConfigError([f"(file): cannot read {path} ({exc.strerror})"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise NodeConfigError([f"(file): not valid YAML ({exc.__class__.__name__})"]) from None
    return parse_config(data, base_dir=path.resolve().parent)
