"""Provider rules: profile selection (R-PROF-2, 8, 9) and adapter-specific settings."""

from __future__ import annotations

from collections.abc import Mapping

from catalog.config.errors import Issues
from catalog.config.profiles import legacy_profile
from catalog.config.profiles.builtin import TYPES_NEEDING_BASE_URL
from catalog.config.profiles.model import CREDENTIAL_HEADERS
from catalog.config.rules.context import Context
from secretref.envnames import refused_name


def resolve_provider_profiles(ctx: Context, issues: Issues) -> None:
    """Resolve each provider's ``profile`` selector or legacy ``type`` to a runtime profile."""
    for item, doc in ctx.valid_providers():
        if doc.profile is not None and doc.type is not None:
            issues.add((*item.path, "type"), "set exactly one of profile or type, not both")
            continue
        if doc.profile is not None:
            profile = ctx.catalog.get(doc.profile)
            if profile is None:
                if doc.profile not in ctx.parsed.profiles:  # an invalid custom is reported there
                    known = ", ".join(sorted(ctx.catalog))
                    issues.add(
                        (*item.path, "profile"), f"unknown profile {doc.profile!r} (known: {known})"
                    )
                continue
            ctx.provider_profiles[item.path] = profile.with_base_url(doc.base_url)
        elif doc.type is not None:
            if doc.type in TYPES_NEEDING_BASE_URL and doc.base_url is None:
                issues.add((*item.path, "base_url"), f"is required for type {doc.type}")
                continue
            ctx.provider_profiles[item.path] = legacy_profile(doc.type, doc.base_url)
        else:
            issues.add((*item.path, "profile"), "is required (or a legacy type)")


def check_adapter_fields(ctx: Context, issues: Issues) -> None:
    """cli-only settings on cli providers only; a reachable base URL for HTTP providers."""
    for item, doc in ctx.valid_providers():
        profile = ctx.provider_profiles.get(item.path)
        if profile is None:
            continue
        if profile.adapter == "cli":
            if doc.command is None:
                issues.add((*item.path, "command"), "is required for a cli provider")
            for key in ("base_url", "credential", "headers"):
                if getattr(doc, key) is not None:
                    issues.add((*item.path, key), "is not used by a cli provider")
            check_program_env(item.path, doc.env or {}, doc.credential_env, issues)
            if not ctx.managed and doc.credential_env is not None:
                issues.add(
                    (*item.path, "credential_env"),
                    "is only used in managed mode (credential_plane.enabled); "
                    "otherwise give the program its secrets with env",
                )
            continue
        for key in ("command", "env", "run_timeout_ms", "credential_env"):
            if getattr(doc, key) is not None:
                issues.add((*item.path, key), "is only for cli providers")
        if profile.needs_base_url() and not profile.base_url:
            issues.add((*item.path, "base_url"), f"is required: profile {profile.name} has none")
        if doc.credential is not None and profile.auth.type == "none":
            issues.add(
                (*item.path, "credential"),
                f"profile {profile.name} sends no credential (auth type none)",
            )


def check_program_env(
    path: tuple[str | int, ...],
    env: Mapping[str, object],
    credential_env: str | None,
    issues: Issues,
) -> None:
    """R-TLS-3: a declared name never changes how programs load (the Node refuses it too)."""
    for name in env:
        reason = refused_name(name)
        if reason is not None:
            issues.add((*path, "env", name), f"is refused: {reason}")
    if credential_env is not None:
        reason = refused_name(credential_env)
        if reason is not None:
            issues.add((*path, "credential_env"), f"is refused: {reason}")
        elif credential_env in env:
            issues.add((*path, "credential_env"), f"{credential_env} is also set in env")


def check_static_headers(ctx: Context, issues: Issues) -> None:
    """Static headers are non-secret: a credential header must come from ``credential``."""
    for item, doc in ctx.valid_providers():
        profile = ctx.provider_profiles.get(item.path)
        auth_header = profile.auth.header.lower() if profile and profile.auth.type != "none" else ""
        for name in doc.headers or {}:
            if name.lower() in CREDENTIAL_HEADERS or name.lower() == auth_header:
                issues.add(
                    (*item.path, "headers", name),
                    "carries a credential; use credential: {env: ...} or {file: ...}",
                )
