"""Custom ``protocol_profiles`` overlays resolved through ``base`` (R-PROF-1, R-PROF-3)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from catalog.config.errors import Issues
from catalog.config.profiles.builtin import BUILTIN_PROFILES
from catalog.config.profiles.model import (
    ADAPTER_BY_DRIVER,
    CAPABILITY_OPERATION,
    CREDENTIAL_HEADERS,
    OPERATIONS_BY_DRIVER,
    THINKING_STYLES,
    AuthSpec,
    RuntimeProfile,
    freeze,
)

if TYPE_CHECKING:
    from catalog.config.parsed import Item
    from catalog.config.schema import ProfileDoc

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _overlay(name: str, base: RuntimeProfile | None, doc: ProfileDoc) -> RuntimeProfile:
    """Apply ``doc`` over ``base``.

    Scalars replace; ``operations`` and ``capabilities`` (what the endpoint serves) replace
    as a whole; ``model_mapping`` and ``extensions`` merge by key; ``auth`` merges by field.
    """
    driver = doc.driver or (base.driver if base else "openai_chat")
    # Operations and capabilities are driver-specific: inherit them only on the same driver.
    inherit = base is not None and base.driver == driver
    operations = dict(base.operations) if base and inherit else {}
    if doc.operations is not None:
        operations = dict(doc.operations)
    capabilities = base.capabilities if base and inherit else frozenset()
    if doc.capabilities is not None:
        capabilities = frozenset(doc.capabilities)
    auth = base.auth if base else AuthSpec("none")
    if doc.auth is not None:
        set_fields = {k: v for k, v in doc.auth.model_dump(exclude_none=True).items()}
        auth = replace(auth, **set_fields)
    mapping = dict(base.model_mapping) if base else {}
    mapping.update(doc.model_mapping or {})
    extensions = dict(base.extensions) if base else {}
    extensions.update(doc.extensions or {})
    return RuntimeProfile(
        name=name,
        base=doc.base,
        adapter=ADAPTER_BY_DRIVER[driver],
        driver=driver,
        base_url=doc.base_url or (base.base_url if base else None),
        operations=MappingProxyType(operations),
        auth=auth,
        capabilities=capabilities,
        model_mapping=MappingProxyType(mapping),
        extensions=freeze(extensions),
    )


def _check(profile: RuntimeProfile, doc: ProfileDoc, path: tuple[str, str], issues: Issues) -> bool:
    """R-PROF-3 closed operation sets and capability/operation coherence; True when valid."""
    before = len(issues)
    allowed = OPERATIONS_BY_DRIVER[profile.driver]
    for op in doc.operations or {}:
        if op not in allowed:
            issues.add(
                (*path, "operations", op),
                f"not an operation of driver {profile.driver} "
                f"(allowed: {', '.join(sorted(allowed))})",
            )
    needed = CAPABILITY_OPERATION[profile.adapter]
    for capability in sorted(profile.capabilities):
        needs = needed.get(capability)
        if needs is not None and needs not in profile.operations:
            issues.add((*path, "capabilities"), f"capability {capability} needs operation {needs}")
    if profile.auth.type == "header" and not profile.auth.header:
        issues.add((*path, "auth", "header"), "is required for auth type header")
    check_extensions(profile, path, issues)
    return len(issues) == before


EXTENSION_KEYS = ("headers", "thinking")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def check_extensions(profile: RuntimeProfile, path: tuple[str, str], issues: Issues) -> None:
    """R-XLATE-3: every ``extensions`` key is applied (``headers``: static, non-secret
    request headers) or refused here, never ignored."""
    for key, value in profile.extensions.items():
        where = (*path, "extensions", key)
        if key not in EXTENSION_KEYS:
            issues.add(where, f"unknown extension (known: {', '.join(EXTENSION_KEYS)})")
            continue
        if key == "thinking":  # R-XLATE-4: the provider's own reasoning switch
            if value not in THINKING_STYLES:
                issues.add(where, f"must be one of {', '.join(THINKING_STYLES)}")
            elif profile.driver != "openai_chat" and value != "none":
                issues.add(where, "applies to an openai_chat profile only (translation to Chat)")
            continue
        if not isinstance(value, Mapping):
            issues.add(where, "must be a mapping of header name -> string")
            continue
        auth_header = profile.auth.header.lower() if profile.auth.type != "none" else ""
        for name, text in value.items():
            if not _HEADER_NAME.fullmatch(name) or not isinstance(text, str):
                issues.add((*where, name), "must be an HTTP header name with a string value")
            elif name.lower() in CREDENTIAL_HEADERS or name.lower() == auth_header:
                issues.add((*where, name), "carries a credential; use a provider credential")


def resolve_profiles(
    items: Mapping[str, Item[ProfileDoc]], issues: Issues
) -> dict[str, RuntimeProfile]:
    """The full catalog: built-ins plus every custom overlay that resolves without error."""
    catalog: dict[str, RuntimeProfile] = dict(BUILTIN_PROFILES)
    failed: set[str] = set()

    def resolve(name: str, chain: tuple[str, ...]) -> RuntimeProfile | None:
        if name in catalog:
            return catalog[name]
        item = items.get(name)
        if item is None or item.doc is None or name in failed:
            return None
        path = ("protocol_profiles", name)
        doc = item.doc
        base = None
        if doc.base is not None:
            if doc.base in chain or doc.base == name:
                cycle = " -> ".join((*chain, name, doc.base))
                issues.add((*path, "base"), f"inheritance cycle: {cycle}")
                failed.add(name)
                return None
            if doc.base not in catalog and doc.base not in items:
                issues.add((*path, "base"), f"unknown profile {doc.base!r}")
                failed.add(name)
                return None
            base = resolve(doc.base, (*chain, name))
            if base is None:
                failed.add(name)
                return None
        elif doc.driver is None:
            issues.add((*path, "driver"), "is required when the profile has no base")
            failed.add(name)
            return None
        profile = _overlay(name, base, doc)
        if not _check(profile, doc, path, issues):
            failed.add(name)
            return None
        catalog[name] = profile
        return profile

    for name in items:
        if name in BUILTIN_PROFILES:
            issues.add(("protocol_profiles", name), "shadows a built-in profile; use another name")
            failed.add(name)
        elif not _NAME.fullmatch(name):
            issues.add(("protocol_profiles", name), "name must be letters, digits, '.', '_' or '-'")
            failed.add(name)
    for name in items:
        if name not in BUILTIN_PROFILES:
            resolve(name, ())
    return catalog
