"""Auth rules: principal tokens and their policy (R-CFG-12, R-PRIN-1..3), the
provider-credential header (R-AUTH-2) and managed/legacy exclusivity with TLS (R-AUTH-3)."""

from __future__ import annotations

from collections.abc import Mapping

from catalog.config.addresses import has_userinfo, is_absolute_url
from catalog.config.errors import Issues, format_path
from catalog.config.rules.context import Context
from catalog.config.schema import CredentialPlaneDoc, EdgeDoc, NodeDoc

# Headers the Edge itself authenticates with: callers on /v1 (Authorization: Bearer, and
# x-api-key on the Anthropic shape), the admin and REST API (session Cookie, Authorization:
# Token) and Nodes (Authorization plus their id header). None may carry a provider credential.
EDGE_AUTH_HEADERS = frozenset({"authorization", "x-api-key", "cookie", "x-iop-node-id"})


def check_provider_auth_header(ctx: Context, issues: Issues) -> None:
    """``openai.provider_auth.from_header`` must not be a header the Edge authenticates with:
    the caller's own Edge credential would be forwarded upstream as a provider credential."""
    openai = ctx.openai
    if openai is None:
        return
    header = openai.provider_auth.from_header
    if header.lower() in EDGE_AUTH_HEADERS:
        issues.add(
            ("openai", "provider_auth", "from_header"),
            f"must not be {header}: the Edge authenticates callers with it "
            f"({', '.join(sorted(EDGE_AUTH_HEADERS))} are refused); "
            "use a header of its own such as X-IOP-Provider-Authorization",
        )


def check_principal_tokens(ctx: Context, issues: Issues) -> None:
    """Duplicate ``token_ref`` or ``token_hash_sha256`` is rejected (R-CFG-12).

    Reads the entries as written, so a duplicate is reported even beside other token errors.
    """
    entries = ctx.parsed.raw_sections["openai"].get("principal_tokens")
    if not isinstance(entries, list):
        return
    for key in ("token_ref", "token_hash_sha256"):
        first: dict[str, int] = {}
        for index, entry in enumerate(entries):
            value = entry.get(key) if isinstance(entry, Mapping) else None
            if not isinstance(value, str):
                continue
            if value in first:
                where = format_path(("openai", "principal_tokens", first[value]))
                issues.add(
                    ("openai", "principal_tokens", index, key), f"duplicate (first at {where})"
                )
            else:
                first[value] = index


def check_principal_policy(ctx: Context, issues: Issues) -> None:
    """A token's ``models`` name configured groups (R-PRIN-1); ``max_queued`` fits the queue.

    Runs after the queue policy is resolved, so ``max_queued`` is checked against the
    effective ``provider_pool.max_queue`` (R-PRIN-3).
    """
    openai = ctx.openai
    if openai is None:
        return
    known = {model.raw_id for model in ctx.parsed.models}
    for index, token in enumerate(openai.principal_tokens):
        path = ("openai", "principal_tokens", index)
        seen: set[str] = set()
        for position, model_id in enumerate(token.models or ()):
            if model_id not in known:
                issues.add((*path, "models", position), f"unknown model group {model_id!r}")
            elif model_id in seen:
                issues.add((*path, "models", position), f"duplicate model group {model_id!r}")
            seen.add(model_id)
        if token.max_queued is not None and token.max_queued > ctx.max_queue:
            issues.add(
                (*path, "max_queued"),
                f"must not exceed provider_pool.max_queue ({ctx.max_queue})",
            )


def check_endpoint_userinfo(ctx: Context, issues: Issues) -> None:
    """No ``user:password@`` in any endpoint: credentials are secret references only."""
    message = "must not carry user-info (user:password@); use credential: {env: ...}"
    for item, doc in ctx.valid_providers():
        if doc.base_url and has_userinfo(doc.base_url):
            issues.add((*item.path, "base_url"), message)
    for name, profile in ctx.parsed.profiles.items():
        if profile.doc is None:
            continue
        if profile.doc.base_url and has_userinfo(profile.doc.base_url):
            issues.add(("protocol_profiles", name, "base_url"), message)
        for op, path in (profile.doc.operations or {}).items():
            if is_absolute_url(path) and has_userinfo(path):
                issues.add(("protocol_profiles", name, "operations", op), message)


def check_control_plane(ctx: Context, issues: Issues) -> None:
    """R-MGD-1: the control plane is this Edge's catalog; an external connector is refused."""
    plane = ctx.parsed.section("credential_plane", CredentialPlaneDoc)
    if plane is not None and plane.control_plane is not None:
        issues.add(
            ("credential_plane", "control_plane"),
            "is not supported: the control plane is this Edge's catalog (credential slots "
            "and routes in its database); remove the key",
        )


def check_credential_plane(ctx: Context, issues: Issues) -> None:
    """R-AUTH-3: managed mode needs TLS on every hop and rejects every legacy credential source;
    R-MGD-2/4: it needs the keyring, the issuer key and every Node's recipient key."""
    if not ctx.managed:
        return
    why = "is not allowed when credential_plane.enabled (managed mode)"
    need = "is required when credential_plane.enabled (managed mode)"
    edge = ctx.parsed.section("edge", EdgeDoc)
    if edge is not None and edge.tls is None:
        issues.add(("edge", "tls"), need)
    plane = ctx.parsed.section("credential_plane", CredentialPlaneDoc)
    if plane is not None:
        if plane.issuer is None:
            issues.add(("credential_plane", "issuer"), need)
        if plane.keyring_file is None:
            issues.add(("credential_plane", "keyring_file"), need)
    for node_item in ctx.parsed.nodes:
        node = node_item.item.doc
        if isinstance(node, NodeDoc) and node.credential_recipient is None:
            issues.add((*node_item.item.path, "credential_recipient"), need)
    openai = ctx.openai
    if openai is not None:
        if openai.enabled and openai.tls is None:
            issues.add(("openai", "tls"), f"{need} and openai.enabled")
        if openai.bearer_token is not None:
            issues.add(("openai", "bearer_token"), why)
        if openai.principal_tokens:
            issues.add(("openai", "principal_tokens"), why)
        if openai.provider_auth.enabled:
            issues.add(("openai", "provider_auth", "enabled"), why)
    for item, doc in ctx.valid_providers():
        for key in ("credential", "headers", "env"):
            if getattr(doc, key):
                issues.add((*item.path, key), why)
