"""The Node's own bound on what any Edge can make it do (R-TLS-3, docs/node.md).

``policy`` in node.yaml is an allowlist. When it is present, a provider is refused on this
Node unless every program it would start (its ``command`` and its ``probe_command``, as the
exact argv) is an allowed argv (or starts with an entry ending in ``"..."``, R-TLS-6,
``nodes.agent.policy_argv``), every environment name it would set is in ``policy.env``
(R-TLS-7), every URL it would dial matches an allowed ``[scheme://]host[:port]`` pattern (a
bare pattern allows https only), and every secret it names is an allowed ``{env}`` name, an
allowed ``{file}`` or a file inside an allowed directory. A kind left out of the policy allows
nothing of that kind. Without ``policy`` the Node runs what its Edge sends, except what no
policy may allow: a URL that is not http(s) (or not a URL at all, R-TLS-9), and a declared
environment name that changes how programs load (``secretref.envnames``).

``Gate.check`` is the one check: the registry calls it for every provider of every payload
it installs (at start and on every pushed revision), the cli adapter before it starts any
program (runs and probes), and the HTTP client before it dials any URL (runs and probes).
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from nodes.agent import policy_argv
from nodes.agent.policy_argv import EXACT
from nodes.wire import NodePayload, ProviderPayload, SecretRefPayload
from obskit.logs import printable
from secretref.envnames import refused_name

_NonEmpty = Annotated[str, Field(strict=True, min_length=1)]
_DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_CACHED_URLS = 1024  # verdicts a Gate keeps (each run dials a URL of its payload)
MAX_SHOWN_URL = 120  # characters of a URL that cannot be parsed, in its refusal
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SecretsPolicy(_Strict):
    env: list[_NonEmpty] = []  # names or fnmatch patterns (``OPENAI_*``)
    files: list[_NonEmpty] = []  # single files (what iop_node_policy prints, R-TLS-8)
    file_dirs: list[_NonEmpty] = []  # any file inside

    @field_validator("files", "file_dirs")
    @classmethod
    def _absolute(cls, value: list[str], info: ValidationInfo) -> list[str]:
        base = (info.context or {}).get("base_dir", ".")
        return [os.path.realpath(os.path.join(base, os.path.expanduser(d))) for d in value]


@dataclass(frozen=True, slots=True)
class HostPattern:
    scheme: str  # https unless the pattern says http://
    host: str  # fnmatch pattern, lower case
    port: int | None  # None: any port

    def matches(self, scheme: str, host: str, port: int | None) -> bool:
        return (
            scheme == self.scheme
            and fnmatch.fnmatchcase(host, self.host)
            and self.port in (None, port)
        )


class NodePolicy(_Strict):
    commands: list[list[_NonEmpty]] = []  # exact argv; a last "..." = prefix; str: shlex
    env: list[_NonEmpty] = []  # names an Edge may set for a program (R-TLS-7), exact
    hosts: list[_NonEmpty] = []  # [http://|https://]host[:port], *.domain, [v6]:port
    secrets: SecretsPolicy = SecretsPolicy()

    @field_validator("commands", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return policy_argv.split_entries(value)

    @field_validator("env")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r}: an exact environment variable name, no pattern")
            reason = refused_name(name)
            if reason is not None:
                raise ValueError(f"{reason}: no policy may allow it")
        return value

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        for pattern in value:
            parse_host(pattern)  # raises ValueError naming the bad pattern
        return [p.strip().lower() for p in value]

    def command_refusal(self, argv: list[str]) -> str | None:
        return policy_argv.refusal(self.commands, argv)

    def env_refusal(self, name: str) -> str | None:
        """R-TLS-7: an allowlist, exact names (the base names are never declared)."""
        return None if name in self.env else f"{name} is not in policy.env"

    def host_allowed(self, scheme: str, host: str, port: int | None) -> bool:
        return any(parse_host(p).matches(scheme, host, port) for p in self.hosts)

    def secret_refusal(self, what: str, ref: SecretRefPayload) -> str | None:
        if ref.env is not None:
            if any(fnmatch.fnmatchcase(ref.env, pattern) for pattern in self.secrets.env):
                return None
            return f"{what}: secret env {ref.env} is not an allowed name"
        if ref.file is not None:
            path = os.path.realpath(os.path.expanduser(ref.file))
            if path in self.secrets.files:
                return None
            for directory in self.secrets.file_dirs:
                if os.path.commonpath([path, directory]) == directory:
                    return None
            return f"{what}: secret file {ref.file} is not an allowed file"
        return None

    def refusal(self, provider: ProviderPayload) -> str | None:
        """Why ``provider`` may not run on this Node, or None (``Gate(self).provider``)."""
        return Gate(self).provider(provider)


@functools.lru_cache(maxsize=1024)  # a policy's patterns, parsed once, not per dial
def parse_host(pattern: str) -> HostPattern:
    """``[scheme://]host[:port]`` -> a pattern; a bare one is https only; IPv6 in brackets."""
    text = pattern.strip().lower()
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "https", text
    elif scheme not in _DEFAULT_PORTS:
        raise ValueError(f"{pattern}: the scheme must be http:// or https://")
    if "/" in rest:
        raise ValueError(f"{pattern}: must be [scheme://]host[:port], without a path")
    if rest.startswith("["):
        host, _, after = rest[1:].partition("]")
        port_text = after[1:] if after.startswith(":") else ""
        if after and not after.startswith(":"):
            raise ValueError(f"{pattern}: must be host[:port] ([v6]:port for IPv6)")
    elif rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
    else:
        host, port_text = rest, ""
    if not host:
        raise ValueError(f"{pattern}: must name a host")
    port = None
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"{pattern}: port must be 1..65535")
        port = int(port_text)
    return HostPattern(scheme, host, port)


@dataclass(frozen=True, slots=True)
class Use:
    """One thing the Node would do for a provider: start ``argv`` giving it the declared
    environment ``env`` (names beyond the base), or dial ``url``."""

    what: str  # "command", "probe command", "upstream"
    argv: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    url: str = ""

    @classmethod
    def program(cls, what: str, argv: list[str] | tuple[str, ...], env: Any = ()) -> Use:
        return cls(what, argv=tuple(argv), env=tuple(sorted(env)))

    @classmethod
    def dial(cls, url: str) -> Use:
        return cls("upstream", url=url)


def declared_env(provider: ProviderPayload, *, probe: bool = False) -> list[str]:
    """The environment names a provider's program gets beyond the base: its ``env`` and,
    for a run (never a probe, R-MGD-10), the name its managed slot secret goes in."""
    names = list(provider.env)
    if provider.credential_env and not probe:
        names.append(provider.credential_env)
    return names


def uses(provider: ProviderPayload) -> Iterator[Use]:
    """Every program and URL ``provider`` can make this Node start or dial."""
    if provider.command is not None:
        yield Use.program("command", provider.command, declared_env(provider))
    if provider.probe_command is not None:
        probe_env = declared_env(provider, probe=True)
        yield Use.program("probe command", provider.probe_command, probe_env)
    for url in provider.operations.values():
        if url:
            yield Use.dial(url)


class Gate:
    """The one policy check for everything a Node starts or dials (R-TLS-3)."""

    def __init__(self, policy: NodePolicy | None = None) -> None:
        self.policy = policy
        # A verdict per URL: the policy never changes, the URLs are the payloads' (bounded).
        self._urls: dict[str, str | None] = {}

    def check(self, provider: ProviderPayload, use: Use) -> str | None:
        """Why this Node may not do ``use`` for ``provider``, or None when it may."""
        if use.url:
            try:
                return self._urls[use.url]
            except KeyError:
                if len(self._urls) >= MAX_CACHED_URLS:
                    self._urls.clear()
                verdict = self._urls[use.url] = self._url(use.url)
                return verdict
        if not use.argv:
            return f"{use.what} is empty"
        for name in use.env:
            reason = refused_name(name)
            if reason is None and self.policy is not None:
                reason = self.policy.env_refusal(name)
            if reason is not None:
                return f"{use.what} environment: {reason}"
        if self.policy is not None:
            reason = self.policy.command_refusal(list(use.argv))
            if reason is not None:
                return f"{use.what} {printable(shlex.join(use.argv))} {reason}"
        return None

    def provider(self, provider: ProviderPayload) -> str | None:
        """The first refusal among everything ``provider`` can make the Node do, or None."""
        for use in uses(provider):
            reason = self.check(provider, use)
            if reason is not None:
                return reason
        if self.policy is None:
            return None
        refs = [("credential", provider.credential)] if provider.credential else []
        refs += [(f"env {name}", ref) for name, ref in sorted(provider.env.items())]
        for what, ref in refs:
            reason = self.policy.secret_refusal(what, ref)
            if reason:
                return reason
        return None

    def _url(self, url: str) -> str | None:
        try:  # R-TLS-9: a URL that cannot be normalised is a refusal, not an exception
            parts = urlsplit(url)
            scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
            port = parts.port or _DEFAULT_PORTS.get(scheme)
        except ValueError:
            return f"upstream {url[:MAX_SHOWN_URL]!r} is not a URL the policy can read"
        shown = f"[{host}]" if ":" in host else host
        if scheme not in _DEFAULT_PORTS:
            return f"upstream {scheme}://{shown} is not http or https"
        if self.policy is None or self.policy.host_allowed(scheme, host, port):
            return None
        return f"upstream {scheme}://{shown}:{port} is not an allowed host"


class PolicyRefused(Exception):
    """A program or URL the policy does not allow; raised at the point of use."""


def require(gate: Gate, provider: ProviderPayload, use: Use) -> None:
    reason = gate.check(provider, use)
    if reason is not None:
        raise PolicyRefused(f"refused by node policy: {reason}")


def policy_for(payload: NodePayload) -> dict[str, Any]:
    """The narrowest policy that allows exactly ``payload``'s providers (node.yaml shape):
    each command and probe command as its exact argv (with the ``"$"`` a Node of the
    previous version also reads as exact), each environment name a program gets, each
    upstream with its scheme, each secret file by itself (R-TLS-8)."""
    commands: list[list[str]] = []
    names: set[str] = set()
    hosts: set[str] = set()
    env: set[str] = set()
    files: set[str] = set()
    for provider in payload.providers:
        for argv in (provider.command, provider.probe_command):
            if argv and [*argv, EXACT] not in commands:
                commands.append([*argv, EXACT])
        if provider.command or provider.probe_command:
            names.update(declared_env(provider))
        for url in provider.operations.values():
            if url and (entry := _host_entry(url)):
                hosts.add(entry)
        refs = [provider.credential, *provider.env.values()]
        for ref in refs:
            if ref is not None and ref.env:
                env.add(ref.env)
            elif ref is not None and ref.file:
                files.add(os.path.abspath(os.path.expanduser(ref.file)))
    return {
        "commands": commands,
        "env": sorted(names),
        "hosts": sorted(hosts),
        "secrets": {"env": sorted(env), "files": sorted(files)},
    }


def _host_entry(url: str) -> str | None:
    try:  # a URL the Node cannot read is refused there: nothing to allow
        parts = urlsplit(url)
        scheme, host = parts.scheme.lower(), parts.hostname or ""
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:
        return None
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return where if scheme == "https" else f"{scheme}://{where}"
