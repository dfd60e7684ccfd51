"""The Node's own bound on what any Edge can make it do (R-TLS-3, docs/node.md).

``policy`` in node.yaml is an allowlist. When it is present, a provider is refused on this
Node unless its command starts with an allowed argv prefix, every upstream URL's host and
port match an allowed ``host[:port]`` pattern, and every secret it names is an allowed
``{env}`` name or a ``{file}`` inside an allowed directory. A kind left out of the policy
allows nothing of that kind. Without ``policy`` the Node runs what its Edge sends.
"""

from __future__ import annotations

import fnmatch
import os
import shlex
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from nodes.wire import NodePayload, ProviderPayload, SecretRefPayload

_NonEmpty = Annotated[str, Field(strict=True, min_length=1)]
_DEFAULT_PORTS = {"http": 80, "https": 443}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SecretsPolicy(_Strict):
    env: list[_NonEmpty] = []  # names or fnmatch patterns (``OPENAI_*``)
    file_dirs: list[_NonEmpty] = []

    @field_validator("file_dirs")
    @classmethod
    def _absolute(cls, value: list[str], info: ValidationInfo) -> list[str]:
        base = (info.context or {}).get("base_dir", ".")
        return [os.path.realpath(os.path.join(base, os.path.expanduser(d))) for d in value]


class NodePolicy(_Strict):
    commands: list[list[_NonEmpty]] = []  # argv prefixes; a string is split like a shell
    hosts: list[_NonEmpty] = []  # host, host:port, *.domain, *.domain:port, [v6]:port
    secrets: SecretsPolicy = SecretsPolicy()

    @field_validator("commands", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        out = []
        for item in value:
            if isinstance(item, str):
                item = shlex.split(item)
            if isinstance(item, list) and not item:
                raise ValueError("an argv prefix must not be empty")
            out.append(item)
        return out

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        for pattern in value:
            _split_host(pattern)  # raises ValueError naming the bad pattern
        return [p.lower() for p in value]

    def refusal(self, provider: ProviderPayload) -> str | None:
        """Why ``provider`` may not run on this Node, or None when the policy allows it."""
        if provider.command is not None and not any(
            provider.command[: len(prefix)] == prefix for prefix in self.commands
        ):
            program = provider.command[0] if provider.command else "(empty)"
            return f"command {program} is not an allowed command prefix"
        for url in provider.operations.values():
            reason = self._host_refusal(url)
            if reason:
                return reason
        refs = [("credential", provider.credential)] if provider.credential else []
        refs += [(f"env {name}", ref) for name, ref in sorted(provider.env.items())]
        for what, ref in refs:
            reason = self._secret_refusal(what, ref)
            if reason:
                return reason
        return None

    def _host_refusal(self, url: str) -> str | None:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        try:
            port = parts.port or _DEFAULT_PORTS.get(parts.scheme.lower())
        except ValueError:
            port = None
        for pattern in self.hosts:
            want_host, want_port = _split_host(pattern)
            if fnmatch.fnmatchcase(host, want_host) and want_port in (None, port):
                return None
        shown = f"[{host}]" if ":" in host else host
        return f"upstream host {shown}:{port} is not an allowed host"

    def _secret_refusal(self, what: str, ref: SecretRefPayload) -> str | None:
        if ref.env is not None:
            if any(fnmatch.fnmatchcase(ref.env, pattern) for pattern in self.secrets.env):
                return None
            return f"{what}: secret env {ref.env} is not an allowed name"
        if ref.file is not None:
            path = os.path.realpath(os.path.expanduser(ref.file))
            for directory in self.secrets.file_dirs:
                if os.path.commonpath([path, directory]) == directory:
                    return None
            return f"{what}: secret file {ref.file} is not inside an allowed directory"
        return None


def _split_host(pattern: str) -> tuple[str, int | None]:
    """``host[:port]`` -> (host pattern, port or None); IPv6 in brackets."""
    text = pattern.strip().lower()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ValueError(f"{pattern}: must be host[:port] ([v6]:port for IPv6)")
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not host:
        raise ValueError(f"{pattern}: must name a host")
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"{pattern}: port must be 1..65535")
        return host, int(port_text)
    return host, None


def policy_for(payload: NodePayload) -> dict[str, Any]:
    """The narrowest policy that allows exactly ``payload``'s providers (node.yaml shape)."""
    commands: list[list[str]] = []
    hosts: set[str] = set()
    env: set[str] = set()
    dirs: set[str] = set()
    for provider in payload.providers:
        if provider.command and provider.command not in commands:
            commands.append(list(provider.command))
        for url in provider.operations.values():
            parts = urlsplit(url)
            host = parts.hostname or ""
            port = parts.port or _DEFAULT_PORTS.get(parts.scheme.lower())
            hosts.add(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        refs = [provider.credential, *provider.env.values()]
        for ref in refs:
            if ref is not None and ref.env:
                env.add(ref.env)
            elif ref is not None and ref.file:
                dirs.add(os.path.dirname(os.path.abspath(os.path.expanduser(ref.file))))
    return {
        "commands": commands,
        "hosts": sorted(hosts),
        "secrets": {"env": sorted(env), "file_dirs": sorted(dirs)},
    }
