"""Assemble the canonical document and the frozen snapshot from a fully valid parse."""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any

from catalog.config.addresses import parse_host_port
from catalog.config.profiles import SEULGIVIBE_TYPES
from catalog.config.profiles.model import freeze
from catalog.config.rules.context import DEFAULT_RUN_TIMEOUT_MS, Context
from catalog.config.rules.fallbacks import fallback_chain
from catalog.config.schema import (
    AdminDoc,
    CredentialPlaneDoc,
    EdgeDoc,
    MeteringDoc,
    ModelDoc,
    NodeDoc,
    OpenAIDoc,
    PriceDoc,
    ProviderDoc,
    ProviderPoolDoc,
)
from catalog.config.schema.base import SecretRefDoc
from catalog.config.schema.openai import BudgetDoc
from catalog.config.schema.sections import ServerTLSDoc
from catalog.config.secrets import SecretRef
from catalog.config.snapshot import (
    Affinity,
    Budget,
    CredentialPlane,
    EdgeSnapshot,
    KeyFile,
    ModelGroupSpec,
    NodeSpec,
    Price,
    PrincipalSpec,
    PrincipalTokenSpec,
    ProviderAuth,
    ProviderSpec,
    StreamEvidenceGate,
    StreamFilter,
    TLSFiles,
)


def _dump(doc: Any, **kwargs: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = doc.model_dump(mode="json", exclude_none=True, **kwargs)
    return dumped


def _secret(doc: SecretRefDoc | None) -> SecretRef | None:
    return None if doc is None else SecretRef(env=doc.env, file=doc.file)


def _price(doc: PriceDoc | None) -> Price | None:
    """R-COST-1: ``cached_input`` omitted is the input price."""
    if doc is None:
        return None
    cached = doc.input if doc.cached_input is None else doc.cached_input
    return Price(doc.input, doc.output, cached)


def _budget(doc: BudgetDoc | None) -> Budget | None:
    return None if doc is None else Budget(doc.tokens, doc.period, doc.amount)


def _tls(doc: ServerTLSDoc | None) -> TLSFiles | None:
    return None if doc is None else TLSFiles(doc.cert_file, doc.key_file, doc.client_ca_file)


def _credential_plane(plane: CredentialPlaneDoc) -> CredentialPlane | None:
    """Managed mode's keys; the rules guarantee them when ``enabled`` (R-MGD-4)."""
    if not plane.enabled or plane.issuer is None or plane.keyring_file is None:
        return None
    return CredentialPlane(
        issuer=KeyFile(plane.issuer.key_id, plane.issuer.private_key_file),
        keyring_file=plane.keyring_file,
        envelope_ttl_s=plane.envelope_ttl_s,
    )


def _recipient(node: NodeDoc) -> KeyFile | None:
    doc = node.credential_recipient
    return None if doc is None else KeyFile(doc.key_id, doc.public_key_file)


def _normalized_provider(doc: ProviderDoc, is_cli: bool) -> ProviderDoc:
    """Defaults that depend on the adapter are written in; legacy queue keys leave."""
    update: dict[str, Any] = {"max_queue": None, "queue_timeout_ms": None}
    if is_cli and doc.run_timeout_ms is None:
        update["run_timeout_ms"] = DEFAULT_RUN_TIMEOUT_MS
    return doc.model_copy(update=update)


def _provider(
    ctx: Context, node_id: str, path: tuple[str | int, ...], doc: ProviderDoc
) -> ProviderSpec:
    profile = ctx.provider_profiles[path]
    if doc.label is not None:
        label = doc.label
    elif doc.type in SEULGIVIBE_TYPES:
        label = doc.type  # R-PROF-8: the canonical Seulgivibe alias stays the label
    else:
        label = profile.name
    return ProviderSpec(
        id=doc.id,
        node_id=node_id,
        label=label,
        profile=profile,
        capacity=doc.capacity,
        long_context_capacity=doc.long_context_capacity,
        context_window_tokens=doc.context_window_tokens,
        priority=doc.priority,
        enabled=doc.enabled,
        command=tuple(doc.command) if doc.command is not None else None,
        credential=_secret(doc.credential),
        headers=freeze(doc.headers or {}),
        env=freeze({name: _secret(ref) for name, ref in (doc.env or {}).items()}),
        first_byte_timeout_ms=doc.first_byte_timeout_ms,
        idle_timeout_ms=doc.idle_timeout_ms,
        run_timeout_ms=doc.run_timeout_ms
        or (DEFAULT_RUN_TIMEOUT_MS if profile.adapter == "cli" else None),
        concurrency=doc.concurrency,
        probe_interval_s=doc.probe_interval_s or 0.0,
        probe_command=tuple(doc.probe_command) if doc.probe_command is not None else None,
        credential_env=doc.credential_env,
        price=_price(doc.price),
    )


def _pool_section(ctx: Context) -> dict[str, Any]:
    """``provider_pool`` with the queue policy resolved; health keys only where written."""
    section: dict[str, Any] = {"max_queue": ctx.max_queue, "queue_timeout_ms": ctx.queue_timeout_ms}
    pool = ctx.parsed.section("provider_pool", ProviderPoolDoc)
    if pool is not None:
        section.update(
            _dump(pool, include={"retry_before_first_byte", "eject_after_failures",
                                 "eject_base_s", "eject_max_s"})
        )  # fmt: skip
    return section


def build_snapshot(ctx: Context) -> EdgeSnapshot:
    """The snapshot of a parse that produced no issues."""
    parsed = ctx.parsed
    edge = parsed.section("edge", EdgeDoc)
    admin = parsed.section("admin", AdminDoc)
    openai = parsed.section("openai", OpenAIDoc)
    plane = parsed.section("credential_plane", CredentialPlaneDoc)
    assert edge and admin and openai and plane, "build_snapshot needs a valid parse"
    document: dict[str, Any] = {
        "edge": _dump(edge),
        "admin": _dump(admin),
        "openai": _dump(openai),
        "provider_pool": _pool_section(ctx),
        "credential_plane": _dump(plane),
        "protocol_profiles": {
            name: _dump(item.doc) for name, item in parsed.profiles.items() if item.doc
        },
        "nodes": [],
        "models": [],
    }
    nodes: list[NodeSpec] = []
    providers: dict[str, ProviderSpec] = {}
    for node_item in parsed.nodes:
        node_doc = node_item.item.doc
        assert isinstance(node_doc, NodeDoc)
        specs, dumped = [], []
        for item in node_item.providers:
            assert item.doc is not None
            spec = _provider(ctx, node_doc.id, item.path, item.doc)
            specs.append(spec)
            providers[spec.id] = spec
            dumped.append(_dump(_normalized_provider(item.doc, spec.adapter == "cli")))
        document["nodes"].append({**_dump(node_doc, exclude={"providers"}), "providers": dumped})
        nodes.append(
            NodeSpec(
                node_doc.id,
                node_doc.alias,
                node_doc.token_hash_sha256,
                tuple(specs),
                _recipient(node_doc),
                node_doc.concurrency,
            )
        )
    models: dict[str, ModelGroupSpec] = {}
    served: dict[str, dict[str, str]] = {}
    declared = {m.doc.id: m.doc.fallbacks for m in parsed.models if isinstance(m.doc, ModelDoc)}
    for model_item in parsed.models:
        model = model_item.doc
        assert isinstance(model, ModelDoc)
        document["models"].append(_dump(model))
        translate = model.translate
        models[model.id] = ModelGroupSpec(
            model.id,
            model.usage_attribution,
            freeze(model.providers),
            translate is not False,
            fallback_chain(model.id, declared),
            refuse_dropped=not isinstance(translate, bool) and translate.unsupported == "refuse",
            affinity=(
                None
                if model.affinity is None
                else Affinity(model.affinity.key, model.affinity.ttl_s)
            ),
            max_output_tokens=model.max_output_tokens,
            price=_price(model.price),
        )
        for provider_id, served_model in model.providers.items():
            served.setdefault(provider_id, {})[model.id] = served_model
    tokens = tuple(
        PrincipalTokenSpec(
            t.token_ref,
            t.token_hash_sha256,
            t.principal_ref,
            t.alias,
            models=None if t.models is None else frozenset(t.models),
            max_in_flight=t.max_in_flight,
            rpm=t.rpm,
            tpm=t.tpm,
            max_queued=t.max_queued,
            budget=_budget(t.budget),
            max_pending_bodies=t.max_pending_bodies,
        )
        for t in openai.principal_tokens
    )
    gate = openai.stream_evidence_gate
    principals = _principals(ctx, document)
    metering = parsed.section("metering", MeteringDoc) or MeteringDoc()
    if parsed.raw_sections["metering"]:  # written only when the document had it
        document["metering"] = _dump(metering)
    return EdgeSnapshot(
        document_json=json.dumps(document, ensure_ascii=False),
        edge_id=edge.id,
        bootstrap_dir=edge.bootstrap_dir,
        edge_listen=parse_host_port(edge.listen),
        edge_tls=_tls(edge.tls),
        admin_listen=parse_host_port(admin.listen),
        admin_token=_secret(admin.token),
        openai_enabled=openai.enabled,
        openai_listen=parse_host_port(openai.listen),
        openai_tls=_tls(openai.tls),
        long_context_threshold_tokens=openai.long_context_threshold_tokens,
        max_request_bytes=openai.max_request_bytes,
        header_timeout_s=openai.header_timeout_s,
        stream_buffer_bytes=openai.stream_buffer_bytes,
        bearer_token=_secret(openai.bearer_token),
        metrics_token=_secret(openai.metrics_token),
        principal_tokens=tokens,
        provider_auth=ProviderAuth(**openai.provider_auth.model_dump()),
        stream_evidence_gate=StreamEvidenceGate(
            enabled=gate.enabled,
            request_fault_recovery=gate.request_fault_recovery,
            strategy_caps=freeze(gate.strategy_caps.model_dump(exclude_none=True)),
            ingress_snapshot_bytes=gate.ingress_snapshot_bytes,
            filters=tuple(
                StreamFilter(f.type, f.hold_evidence_runes, f.enforcement) for f in gate.filters
            ),
        ),
        max_queue=ctx.max_queue,
        queue_timeout_ms=ctx.queue_timeout_ms,
        retry_before_first_byte=ctx.retry_before_first_byte,
        eject_after_failures=ctx.eject_after_failures,
        eject_base_s=ctx.eject_base_s,
        eject_max_s=ctx.eject_max_s,
        credential_plane_enabled=plane.enabled,
        credential_plane=_credential_plane(plane),
        profiles=MappingProxyType(dict(ctx.catalog)),
        nodes=tuple(nodes),
        providers=MappingProxyType(providers),
        models=MappingProxyType(models),
        _nodes_by_id=MappingProxyType({node.id: node for node in nodes}),
        _served_by_provider=freeze(served),
        principals=MappingProxyType(principals),
        currency=metering.currency,
    )


def _principals(ctx: Context, document: dict[str, Any]) -> dict[str, PrincipalSpec]:
    """R-MGD-13: ``principals:`` by id, and into the canonical document when present."""
    out: dict[str, PrincipalSpec] = {}
    dumped = []
    for item in ctx.parsed.principals:
        p = item.doc
        assert p is not None
        dumped.append(_dump(p))
        out[p.id] = PrincipalSpec(
            p.id, _budget(p.budget), p.rpm, p.tpm, p.max_in_flight, p.max_queued
        )
    if dumped:
        document["principals"] = dumped
    return out
