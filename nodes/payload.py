"""Compile the node-specific payload provider-first from the snapshot (R-NODE-2, R-PROF-8)."""

from __future__ import annotations

from typing import Any

import msgspec

from catalog.config import EdgeSnapshot
from nodes import wire


def _secret(ref: Any) -> wire.SecretRefPayload | None:
    if ref is None:
        return None
    return wire.SecretRefPayload(env=ref.env, file=ref.file)


def compile_payload(snapshot: EdgeSnapshot, node_id: str) -> wire.NodePayload:
    """Everything one Node needs to run its providers; equal inputs give equal revisions."""
    node = snapshot.node(node_id)
    if node is None:
        return wire.NodePayload(node_id=node_id, revision=wire.payload_revision({}), providers=[])
    served: dict[str, dict[str, str]] = {}
    for model in snapshot.models.values():
        for provider_id, target in model.providers.items():
            served.setdefault(provider_id, {})[model.id] = target
    providers = []
    for spec in sorted(node.providers, key=lambda p: p.id):  # order is not a change
        profile = spec.profile
        providers.append(
            wire.ProviderPayload(
                id=spec.id,
                label=spec.label,
                adapter=profile.adapter,
                driver=profile.driver,
                operations={op: profile_url(profile, op) for op in sorted(profile.operations)},
                auth=wire.AuthPayload(
                    type=profile.auth.type, header=profile.auth.header, scheme=profile.auth.scheme
                ),
                credential=_secret(spec.credential),
                # R-XLATE-3: the profile's extension headers, the provider's own win.
                headers={**profile.extension_headers(), **spec.headers},
                capabilities=sorted(profile.capabilities),
                model_mapping=dict(profile.model_mapping),
                served_models=served.get(spec.id, {}),
                command=list(spec.command) if spec.command else None,
                env={name: _secret(ref) for name, ref in spec.env.items()},  # type: ignore[misc]
                first_byte_timeout_s=spec.first_byte_timeout_ms / 1000,
                idle_timeout_s=spec.idle_timeout_ms / 1000,
                run_timeout_s=(spec.run_timeout_ms / 1000) if spec.run_timeout_ms else None,
                probe_interval_s=spec.probe_interval_s,
                probe_command=list(spec.probe_command) if spec.probe_command else None,
                credential_env=spec.credential_env,
            )
        )
    body = msgspec.to_builtins(providers)
    return wire.NodePayload(
        node_id=node_id, revision=wire.payload_revision({"providers": body}), providers=providers
    )


def profile_url(profile: Any, op: str) -> str:
    """The complete upstream URL for an operation, or '' when the profile has no base (cli)."""
    try:
        return str(profile.resolve_operation_url(op))
    except (KeyError, ValueError):
        return ""
