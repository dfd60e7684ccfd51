"""What the cross-field rules read and what the resolving rules record for the builder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from catalog.config.errors import Issues
from catalog.config.parsed import Item, Parsed
from catalog.config.profiles import RuntimeProfile
from catalog.config.schema import CredentialPlaneDoc, OpenAIDoc, ProviderDoc

DEFAULT_MAX_QUEUE = 16
DEFAULT_QUEUE_TIMEOUT_MS = 30000
DEFAULT_RUN_TIMEOUT_MS = 300000
DEFAULT_RETRY_BEFORE_FIRST_BYTE = 1  # R-HEALTH-1
DEFAULT_EJECT_AFTER_FAILURES = 3  # R-HEALTH-2
DEFAULT_EJECT_BASE_S = 10.0
DEFAULT_EJECT_MAX_S = 300.0


@dataclass
class Context:
    """The parsed document plus what earlier rules resolved (profiles, queue policy)."""

    parsed: Parsed
    catalog: dict[str, RuntimeProfile]
    provider_profiles: dict[tuple[str | int, ...], RuntimeProfile] = field(default_factory=dict)
    max_queue: int = DEFAULT_MAX_QUEUE
    queue_timeout_ms: int = DEFAULT_QUEUE_TIMEOUT_MS
    retry_before_first_byte: int = DEFAULT_RETRY_BEFORE_FIRST_BYTE
    eject_after_failures: int = DEFAULT_EJECT_AFTER_FAILURES
    eject_base_s: float = DEFAULT_EJECT_BASE_S
    eject_max_s: float = DEFAULT_EJECT_MAX_S

    @property
    def openai(self) -> OpenAIDoc | None:
        return self.parsed.section("openai", OpenAIDoc)

    @property
    def managed(self) -> bool:
        """True in managed credential mode (``credential_plane.enabled``)."""
        plane = self.parsed.section("credential_plane", CredentialPlaneDoc)
        return plane is not None and plane.enabled

    def valid_providers(self) -> list[tuple[Item[ProviderDoc], ProviderDoc]]:
        """Provider items that parsed, with their docs."""
        return [(item, item.doc) for item in self.parsed.providers() if item.doc is not None]


Rule = Callable[[Context, Issues], None]
