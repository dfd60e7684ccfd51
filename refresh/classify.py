"""Live or restart-required: the one declared table of live-appliable paths (R-REF-2).

A changed path is live only when ``LIVE_PARAMETERS`` lists it; everything else is
restart-required by construction. ``RESTART_CLASSES`` only names *why* a path needs a restart
(for the report and the docs); it never makes a path live. Bounds are enforced by the config
loader, which validates every candidate before it is classified.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from refresh.diff import Change, Path, matches, parse_pattern

LIVE, RESTART = "live", "restart_required"


@dataclass(frozen=True, slots=True)
class Parameter:
    """A path pattern, what it means, its bounds, and whether everything below it matches too.

    ``kinds`` narrows a row to some change kinds (a removal that only shrinks access).
    """

    pattern: str
    meaning: str
    bounds: str = ""
    subtree: bool = False
    kinds: tuple[str, ...] = ()
    path: Path = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", parse_pattern(self.pattern))

    def covers(self, path: Path, kind: str | None = None) -> bool:
        if self.kinds and kind not in self.kinds:
            return False
        return matches(path, self.path, subtree=self.subtree)


LIVE_PARAMETERS: tuple[Parameter, ...] = (
    Parameter("nodes[*].providers[*].capacity", "provider capacity (normal slots)", ">= 1"),
    Parameter(
        "nodes[*].providers[*].long_context_capacity",
        "provider long-context slots",
        "0..capacity, within the long-context budget",
    ),
    Parameter("nodes[*].providers[*].priority", "provider priority (lower is preferred)", "int"),
    Parameter("nodes[*].providers[*].enabled", "provider in the dispatch pool (R-CFG-9)", "bool"),
    Parameter("provider_pool.max_queue", "root queue bound (R-POOL-4)", "0/omitted -> 16"),
    Parameter(
        "provider_pool.queue_timeout_ms", "root queue wait bound (R-POOL-4)", ">= 0, 0 = none"
    ),
    Parameter(
        "models[*].fallbacks",
        "model groups tried in order when this one cannot serve (R-FALL-1)",
        "known group ids, no loop, no GLM plan crossing, omitted = none",
        subtree=True,
    ),
    Parameter(
        "models[*].translate",
        "serve operations a provider's driver lacks by translation (R-XLATE-1); "
        "what it would drop: named or refused (R-XLATE-5)",
        "bool or {unsupported: drop|refuse}, default false",
        subtree=True,
    ),
    Parameter(
        "models[*].max_output_tokens",
        "output tokens one request may ask of the group (R-LIM-5)",
        ">= 1, omitted = none",
    ),
    Parameter(
        "provider_pool.retry_before_first_byte",
        "retries on another provider before the first byte (R-HEALTH-1)",
        "0..3, default 1",
    ),
    Parameter(
        "provider_pool.eject_after_failures",
        "failures in a row that eject a provider (R-HEALTH-2)",
        "0..1000, default 3, 0 = never",
    ),
    Parameter(
        "provider_pool.eject_base_s", "first ejection length (R-HEALTH-2)", "(0, 3600], default 10"
    ),
    Parameter(
        "provider_pool.eject_max_s",
        "longest ejection (R-HEALTH-2)",
        ">= eject_base_s, <= 86400, default 300",
    ),
    Parameter(
        "nodes[*].providers[*].probe_interval_s",
        "active probe interval (R-HEALTH-3)",
        "0 = off, else 1..86400",
    ),
    Parameter(
        "nodes[*].providers[*].probe_command", "cli provider's probe program (R-HEALTH-3)", "argv"
    ),
    Parameter(
        "nodes[*].providers[*].price",
        "provider price per million input, output and cached input tokens (R-COST-1)",
        "0..1000000, 6 decimal places, cached_input omitted = input; wins over the group's",
        subtree=True,
    ),
    Parameter(
        "metering",
        "the currency of every price and budget amount (R-COST-1)",
        "three uppercase letters, default USD",
        subtree=True,
    ),
    Parameter(
        "models",
        "model catalog: groups added/removed, provider mappings, usage attribution (R-CFG-4)",
        "mapped providers must exist",
        subtree=True,
    ),
    Parameter(
        "principals",
        "principals' budgets and limits over all their keys (R-MGD-13)",
        "unique ids; limits >= 1; a token's budget equal to its principal's",
        subtree=True,
    ),
    Parameter(
        "openai.long_context_threshold_tokens", "OpenAI long-context threshold (R-POOL-7)", "> 0"
    ),
    Parameter(
        "openai.principal_tokens[*]",
        "principal token revoked (only shrinks access)",
        "removed only",
        kinds=("removed",),
    ),
    Parameter(
        "openai.principal_tokens[*].models",
        "model groups a principal token may call (R-PRIN-1)",
        "configured model group ids, omitted = all",
    ),
    Parameter(
        "openai.principal_tokens[*].max_in_flight",
        "principal token in-flight limit (R-PRIN-2)",
        ">= 1, omitted = none",
    ),
    Parameter(
        "openai.principal_tokens[*].rpm",
        "principal token requests per window (R-PRIN-2)",
        ">= 1, omitted = none",
    ),
    Parameter(
        "openai.principal_tokens[*].tpm",
        "principal token tokens per window (R-PRIN-2)",
        ">= 1, omitted = none",
    ),
    Parameter(
        "openai.principal_tokens[*].budget",
        "principal token budget per UTC calendar period (R-BUD-1, R-COST-3)",
        "{tokens: >= 1 | amount: > 0, period: day | week | month}, omitted = none",
        subtree=True,
    ),
    Parameter(
        "openai.principal_tokens[*].max_queued",
        "principal token share of the queue (R-PRIN-3)",
        "1..provider_pool.max_queue, omitted = none",
    ),
    Parameter(
        "openai.principal_tokens[*].max_pending_bodies",
        "principal token requests still sending their body (R-LIM-2)",
        ">= 1, omitted = 8",
    ),
    Parameter(
        "openai.stream_buffer_bytes",
        "relay buffer per stream before Node backpressure (R-IN-5)",
        "65536..67108864",
    ),
)

# Ordered most specific first: the first class that covers a path names its reason.
RESTART_CLASSES: tuple[Parameter, ...] = (
    Parameter("edge.id", "Edge identity"),
    Parameter("edge.listen", "Edge listener (Node websocket)"),
    Parameter("edge.tls", "Edge transport TLS (R-AUTH-4)", subtree=True),
    Parameter("edge.bootstrap_dir", "bootstrap artifact path"),
    Parameter("edge", "Edge settings", subtree=True),
    Parameter("admin", "admin listener (R-REF-1)", subtree=True),
    Parameter("openai.enabled", "OpenAI listener"),
    Parameter("openai.listen", "OpenAI listener"),
    Parameter("openai.tls", "OpenAI listener TLS", subtree=True),
    Parameter("openai.max_request_bytes", "body limit of every HTTP listener (R-IN-1)"),
    Parameter("openai.header_timeout_s", "header deadline of every HTTP listener (R-IN-5)"),
    Parameter("openai.bearer_token", "legacy caller token (R-AUTH-1)"),
    Parameter("openai.principal_tokens", "principal tokens (R-CFG-12)", subtree=True),
    Parameter("openai.provider_auth", "legacy provider auth (R-AUTH-2)", subtree=True),
    Parameter(
        "openai.stream_evidence_gate", "Stream Evidence Gate settings (R-SEG-1)", subtree=True
    ),
    Parameter("openai", "OpenAI ingress settings", subtree=True),
    Parameter("credential_plane", "credential plane (R-AUTH-4)", subtree=True),
    Parameter("protocol_profiles", "protocol profile catalog (R-PROF-1)", subtree=True),
    Parameter("nodes[*]", "node add/remove"),
    Parameter("nodes[*].token_hash_sha256", "node token"),
    Parameter("nodes[*].alias", "node alias"),
    Parameter(
        "nodes[*].credential_recipient", "node credential recipient key (R-MGD-4)", subtree=True
    ),
    Parameter("nodes[*].providers[*]", "provider add/remove"),
    Parameter("nodes[*].providers[*].profile", "provider profile selector (R-PROF-2)"),
    Parameter("nodes[*].providers[*].type", "provider profile selector (legacy type)"),
    Parameter("nodes[*].providers[*]", "provider adapter settings", subtree=True),
    Parameter("nodes[*]", "node settings", subtree=True),
)
OTHER = "not in the live table"


@dataclass(frozen=True, slots=True)
class Classified:
    """A change with its class (``live`` or ``restart_required``) and the reason."""

    change: Change
    klass: str
    reason: str

    @property
    def live(self) -> bool:
        return self.klass == LIVE


def classify_path(path: Path, kind: str | None = None) -> tuple[str, str]:
    """(class, reason) of one changed path (of change ``kind`` when known)."""
    for parameter in LIVE_PARAMETERS:
        if parameter.covers(path, kind):
            return LIVE, parameter.meaning
    for restart in RESTART_CLASSES:
        if restart.covers(path):
            return RESTART, restart.meaning
    return RESTART, OTHER


def classify(changes: list[Change]) -> list[Classified]:
    """Classify every change, keeping the diff's sorted order."""
    out = []
    for change in changes:
        klass, reason = classify_path(change.path, change.kind)
        out.append(Classified(change, klass, reason))
    return out
