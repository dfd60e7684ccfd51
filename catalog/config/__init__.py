"""The Edge config snapshot: load, defaults, validation and protocol profiles.

Pure Python (pydantic + PyYAML); nothing here imports Django, so the pool engine, the Node
agent and tests can use it directly.

Its names are imported on first use (PEP 562): importing one submodule, or ``ConfigError``
from here, does not build the whole schema (about 0.2 s of CPU in every ``manage.py``
command that never loads a config).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from catalog.config.addresses import HostPort
    from catalog.config.errors import ConfigError, ConfigIssue
    from catalog.config.load import load_file, load_snapshot
    from catalog.config.profiles import (
        BUILTIN_PROFILES,
        CAPABILITIES,
        LEGACY_TYPES,
        OPERATIONS_BY_DRIVER,
        AuthSpec,
        RuntimeProfile,
        UnknownOperationError,
    )
    from catalog.config.secrets import SecretRef, SecretUnavailableError
    from catalog.config.snapshot import (
        Affinity,
        CredentialPlane,
        EdgeSnapshot,
        KeyFile,
        ModelGroupSpec,
        NodeSpec,
        PrincipalTokenSpec,
        ProviderAuth,
        ProviderSpec,
        StreamEvidenceGate,
        StreamFilter,
        TLSFiles,
    )
    from catalog.config.text import parse_text

_LAZY = {
    "HostPort": "catalog.config.addresses",
    "ConfigError": "catalog.config.errors",
    "ConfigIssue": "catalog.config.errors",
    "load_file": "catalog.config.load",
    "load_snapshot": "catalog.config.load",
    "BUILTIN_PROFILES": "catalog.config.profiles",
    "CAPABILITIES": "catalog.config.profiles",
    "LEGACY_TYPES": "catalog.config.profiles",
    "OPERATIONS_BY_DRIVER": "catalog.config.profiles",
    "AuthSpec": "catalog.config.profiles",
    "RuntimeProfile": "catalog.config.profiles",
    "UnknownOperationError": "catalog.config.profiles",
    "SecretRef": "catalog.config.secrets",
    "SecretUnavailableError": "catalog.config.secrets",
    "Affinity": "catalog.config.snapshot",
    "CredentialPlane": "catalog.config.snapshot",
    "EdgeSnapshot": "catalog.config.snapshot",
    "KeyFile": "catalog.config.snapshot",
    "ModelGroupSpec": "catalog.config.snapshot",
    "NodeSpec": "catalog.config.snapshot",
    "PrincipalTokenSpec": "catalog.config.snapshot",
    "ProviderAuth": "catalog.config.snapshot",
    "ProviderSpec": "catalog.config.snapshot",
    "StreamEvidenceGate": "catalog.config.snapshot",
    "StreamFilter": "catalog.config.snapshot",
    "TLSFiles": "catalog.config.snapshot",
    "parse_text": "catalog.config.text",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "BUILTIN_PROFILES",
    "CAPABILITIES",
    "LEGACY_TYPES",
    "OPERATIONS_BY_DRIVER",
    "Affinity",
    "AuthSpec",
    "ConfigError",
    "ConfigIssue",
    "CredentialPlane",
    "EdgeSnapshot",
    "HostPort",
    "KeyFile",
    "ModelGroupSpec",
    "NodeSpec",
    "PrincipalTokenSpec",
    "ProviderAuth",
    "ProviderSpec",
    "RuntimeProfile",
    "SecretRef",
    "SecretUnavailableError",
    "StreamEvidenceGate",
    "StreamFilter",
    "TLSFiles",
    "UnknownOperationError",
    "load_file",
    "load_snapshot",
    "parse_text",
]
