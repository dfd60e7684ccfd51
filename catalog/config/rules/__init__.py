"""Cross-field rules, run in order after parsing; each appends issues (R-CFG-5)."""

from catalog.config.rules.auth import (
    check_control_plane,
    check_credential_plane,
    check_endpoint_userinfo,
    check_principal_policy,
    check_principal_tokens,
    check_provider_auth_header,
)
from catalog.config.rules.budgets import check_budgets
from catalog.config.rules.catalog import (
    check_long_context_budget,
    check_model_references,
    check_served_models,
    check_unique_ids,
)
from catalog.config.rules.context import Context, Rule
from catalog.config.rules.example_tokens import check_example_token_hashes
from catalog.config.rules.fallbacks import check_fallbacks
from catalog.config.rules.health import check_probes, resolve_health
from catalog.config.rules.listeners import check_listener_ports
from catalog.config.rules.providers import (
    check_adapter_fields,
    check_static_headers,
    resolve_provider_profiles,
)
from catalog.config.rules.queue import promote_legacy_queue
from catalog.config.rules.seg import check_stream_evidence_gate

# Order matters only where a rule resolves what later rules read (profiles, queue policy).
RULES: tuple[Rule, ...] = (
    resolve_provider_profiles,
    check_adapter_fields,
    check_static_headers,
    check_unique_ids,
    check_model_references,
    check_served_models,
    check_fallbacks,
    check_long_context_budget,
    promote_legacy_queue,
    resolve_health,
    check_probes,
    check_principal_tokens,
    check_example_token_hashes,
    check_provider_auth_header,
    check_principal_policy,
    check_budgets,
    check_endpoint_userinfo,
    check_control_plane,
    check_credential_plane,
    check_stream_evidence_gate,
    check_listener_ports,
)

__all__ = ["RULES", "Context", "Rule"]
