"""The Edge config snapshot: load, defaults, validation and protocol profiles.

Pure Python (pydantic + PyYAML); nothing here imports Django, so the pool engine, the Node
agent and tests can use it directly.
"""

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
