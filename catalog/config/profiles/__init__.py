"""Protocol profiles: the runtime model, the built-ins and custom overlay resolution."""

from catalog.config.profiles.builtin import (
    BUILTIN_PROFILES,
    LEGACY_TYPES,
    SEULGIVIBE_TYPES,
    legacy_profile,
)
from catalog.config.profiles.model import (
    ADAPTER_BY_DRIVER,
    CAPABILITIES,
    OPERATIONS_BY_DRIVER,
    AuthSpec,
    RuntimeProfile,
    UnknownOperationError,
)

__all__ = [
    "ADAPTER_BY_DRIVER",
    "BUILTIN_PROFILES",
    "CAPABILITIES",
    "LEGACY_TYPES",
    "OPERATIONS_BY_DRIVER",
    "SEULGIVIBE_TYPES",
    "AuthSpec",
    "RuntimeProfile",
    "UnknownOperationError",
    "legacy_profile",
]
