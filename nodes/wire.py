"""The Edge <-> Node wire: every message type, defined once, used by both sides.

One JSON message per websocket frame, tagged by ``type``. Decoding validates the
shape; an unknown type, a missing field or an unknown field is a ``WireError``
and the receiver closes that connection with the reason (nothing else is
disturbed). This module imports nothing from Django: the Node agent uses it too.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

# 2: a run_end may carry the run's last output (``RunEnd.data``). An Edge still accepts a
# protocol 1 Node (it never sends that field), so Edges are upgraded before their Nodes.
# 3: a run's usage may carry cached input tokens (``Usage.cached_input_tokens``, R-COST-1).
# The Edge declares 3 in the websocket handshake (``WIRE_SUBPROTOCOL``, offered by the Node and
# chosen by an Edge that speaks it); a Node registers 3 only then, else 2 and sends no field
# of 3 (``for_edge``): a Node and an Edge of adjacent versions work in both directions.
PROTOCOL_VERSION = 3
WIRE_SUBPROTOCOL = "iop-wire.3"
ACCEPTED_PROTOCOLS = frozenset({1, 2, PROTOCOL_VERSION})
# Versions meet at register (R-HA-4; docs/architecture.md): which optional field of which
# message came in which protocol version. A peer is sent a field only when the protocol it
# stated at register has it (``for_protocol``): a Node one version older is never sent a
# field it would refuse (every message forbids unknown fields). request_id and traceparent
# came late in protocol 1: a protocol 1 Node may not know them, so they count as 2's.
FIELDS_SINCE: dict[str, dict[str, int]] = {
    "run_end": {"data": 2},
    "run_request": {"request_id": 2, "traceparent": 2},
    "tunnel_request": {"request_id": 2, "traceparent": 2},
}
# The Anthropic Messages API version the anthropic_messages driver sends (R-XLATE-3).
ANTHROPIC_VERSION = "2023-06-01"
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # both sides configure their websocket with this limit
MAX_EVENT_DATA_CHARS = 512 * 1024  # a run_event or run_body_part larger than this is split
SPLIT_BODY_BYTES = 1024 * 1024  # a run body larger than this travels in run_body_part messages
MAX_BODY_CHARS = 64 * 1024 * 1024  # the Node reassembles at most this much body (R-IN-2)
NODE_ID_HEADER = "x-iop-node-id"  # plus "authorization: Bearer <token>" on the upgrade request

# Close codes used after accept (4xxx: application-defined).
CLOSE_PROTOCOL_ERROR = 4400
CLOSE_UNAUTHORIZED = 4401
CLOSE_SUPERSEDED = 4409
CLOSE_HEARTBEAT_TIMEOUT = 4408
CLOSE_SHUTDOWN = 4503


class WireError(ValueError):
    """A frame that is not a valid message of this protocol version."""


class _Msg(msgspec.Struct, tag_field="type", forbid_unknown_fields=True, omit_defaults=True):
    pass


# --- shared pieces ---------------------------------------------------------------------------


class SecretRefPayload(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A secret named by reference and resolved on the machine that uses it."""

    env: str | None = None
    file: str | None = None


class AuthPayload(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """How a provider credential is put on the upstream request."""

    type: str = "none"  # none | bearer | header
    header: str = "Authorization"
    scheme: str = "Bearer"


class ProviderPayload(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One provider as the Node runs it, compiled provider-first by the Edge (R-NODE-2)."""

    id: str
    label: str
    adapter: str  # openai_compat | ollama | cli
    driver: str  # openai_chat | anthropic_messages | openai_responses | ollama | cli
    operations: dict[str, str] = {}  # operation -> complete upstream URL (R-PROF-6)
    auth: AuthPayload = msgspec.field(default_factory=AuthPayload)
    credential: SecretRefPayload | None = None
    headers: dict[str, str] = {}  # static, non-secret extra headers
    capabilities: list[str] = []
    model_mapping: dict[str, str] = {}  # unused: the Edge maps once itself (R-PROF-5)
    served_models: dict[str, str] = {}  # model group -> served model name
    command: list[str] | None = None  # cli adapter
    env: dict[str, SecretRefPayload] = {}  # cli adapter: extra environment, by reference
    first_byte_timeout_s: float = 60.0
    idle_timeout_s: float = 120.0
    run_timeout_s: float | None = None  # cli adapter: whole-run limit
    extensions: dict[str, Any] = {}  # unused: the Edge applies a profile's extensions itself
    probe_interval_s: float = 0.0  # R-HEALTH-3: 0 = no active probe
    probe_command: list[str] | None = None  # cli adapter: the probe; exit 0 = healthy
    credential_env: str | None = None  # cli adapter, managed mode: the slot secret's env name


class NodePayload(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    node_id: str
    revision: str  # content hash of this payload; equal payloads have equal revisions
    providers: list[ProviderPayload] = []


class Usage(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A run's tokens. ``input_tokens`` counts every prompt token; ``cached_input_tokens``
    is the part of them the upstream read from its prompt cache (R-COST-1; protocol 3, so
    a Node sends it only to an Edge that chose ``WIRE_SUBPROTOCOL``: ``for_edge``)."""

    input_tokens: int = 0
    output_tokens: int = 0
    estimated: bool = False
    cached_input_tokens: int = 0


# Where a run failed (R-HEALTH-1): only the first two may be retried on another provider.
PHASE_CONNECT = "connect"  # the upstream was never reached (refused, DNS, TLS, connect timeout)
PHASE_BEFORE_FIRST_BYTE = "before_first_byte"  # reached, but no output was emitted
PHASE_AFTER_FIRST_BYTE = "after_first_byte"  # output was emitted: never retried
BEFORE_FIRST_BYTE = frozenset({PHASE_CONNECT, PHASE_BEFORE_FIRST_BYTE})
MAX_RETRY_AFTER_S = 3600.0  # an upstream's Retry-After is bounded before it is reported


class RunError(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A run's failure. ``code`` is stable: upstream_error, upstream_timeout, cancelled,
    node_shutdown, node_gone, bad_request, unknown_provider, credential_refused, and
    relay_unavailable (set by an Edge: run routing between Edges lost Redis,
    docs/scale-out.md). ``retryable``: another provider may succeed; ``phase``: how far the
    run got (empty = unknown, treated as after the first byte); ``retry_after_s``: the
    upstream's Retry-After on a 429."""

    code: str
    message: str
    retryable: bool = False
    status: int | None = None  # the upstream's HTTP status, when there was one
    phase: str = ""
    retry_after_s: float | None = None

    @property
    def before_first_byte(self) -> bool:
        """Nothing of the run reached the Edge and another provider may succeed."""
        return self.retryable and self.phase in BEFORE_FIRST_BYTE

    @property
    def reason(self) -> str:
        """A short reason without any upstream address: for health, logs and ``/pool``."""
        if self.phase == PHASE_CONNECT:
            return "cannot connect to the upstream"
        if self.status == 429:
            return "rate limited by the upstream (HTTP 429)"
        if self.status is not None:
            return f"upstream answered HTTP {self.status}"
        if self.code == "upstream_timeout":
            return "no answer from the upstream in time"
        return "upstream failed before the first byte"


# --- Node -> Edge ---------------------------------------------------------------------------


class Register(_Msg, tag="register"):
    """``protocol``: the Node's. Defaults are never encoded, so the default must be what an
    absent field meant to every earlier Node: 1 (a protocol 1 Node omits it). A Node sends
    ``Register(node_id, protocol=PROTOCOL_VERSION)``; the Nodes of protocol 2 before this
    rule omitted their 2 and are taken for 1 (sent no field of 2's: R-HA-4)."""

    node_id: str
    protocol: int = 1
    agent_version: str = ""


class Ready(_Msg, tag="ready"):
    """The payload is applied. ``unavailable``: providers this Node will not run, by id, with
    the reason (its own policy refused them, a secret is missing...; R-TLS-3)."""

    generation: int
    revision: str
    unavailable: dict[str, str] = {}


class RunEvent(_Msg, tag="run_event"):
    """Output of a run, in order: SSE text for streams, the body for non-streams.
    One frame may carry several upstream chunks that arrived together."""

    run_id: str
    data: str


class RunEnd(_Msg, tag="run_end"):
    """The one terminal message of a run. ``data``: output sent with it rather than in a
    ``run_event`` of its own (a non-stream answer: one frame less, docs/performance.md);
    it follows every ``run_event`` of the run and counts against the run's credit."""

    run_id: str
    ok: bool
    error: RunError | None = None
    usage: Usage | None = None
    data: str = ""


class ProbeResult(_Msg, tag="probe_result"):
    """An active probe's verdict on one provider (R-HEALTH-3); ``reason`` has no address."""

    provider_id: str
    ok: bool
    reason: str = ""


class ConfigRefreshAck(_Msg, tag="config_refresh_ack"):
    revision: str
    ok: bool = True
    error: str | None = None
    unavailable: dict[str, str] = {}  # as in ``Ready``, for the refreshed payload


class Ping(_Msg, tag="ping"):
    ts: float = 0.0


class Pong(_Msg, tag="pong"):
    ts: float = 0.0


# --- Edge -> Node ---------------------------------------------------------------------------


class RegisterResponse(_Msg, tag="register_response"):
    generation: int
    payload: NodePayload
    heartbeat_interval_s: float = 15.0
    heartbeat_timeout_s: float = 45.0


class RunBodyPart(_Msg, tag="run_body_part"):
    """One piece of a run body larger than ``SPLIT_BODY_BYTES`` (R-IN-2): sent in order just
    before its run_request / tunnel_request, which then says how many pieces there were
    (``body_parts``) and carries ``null`` as its ``body``."""

    run_id: str
    data: str


class RunRequest(_Msg, tag="run_request"):
    """Normalized execution (ollama, cli): ``body`` is an OpenAI chat completions request
    whose ``model`` is already the provider's served target.

    ``credit`` > 0 turns on flow control (R-IN-5): the Node sends at most that many
    characters of run_event data before a ``credit`` message allows more."""

    run_id: str
    provider_id: str
    operation: str
    stream: bool
    body: msgspec.Raw
    body_parts: int = 0
    credit: int = 0
    lease_envelope: dict[str, Any] | None = None  # managed mode: the run's credential (R-MGD-4)
    request_id: str = ""  # R-OBS-1: on the Node's log lines and sent upstream as x-request-id
    traceparent: str = ""  # R-OBS-2: W3C trace context of the Edge's request span


class TunnelRequest(_Msg, tag="tunnel_request"):
    """Passthrough (openai_compat): ``body`` goes upstream as is, to the provider's URL for
    ``operation``. ``forward_headers`` carries a legacy caller provider token (R-AUTH-2).
    ``body_parts`` and ``credit`` as in ``RunRequest``."""

    run_id: str
    provider_id: str
    operation: str
    stream: bool
    body: msgspec.Raw
    forward_headers: dict[str, str] = {}
    body_parts: int = 0
    credit: int = 0
    lease_envelope: dict[str, Any] | None = None  # managed mode: the run's credential (R-MGD-4)
    request_id: str = ""  # as in ``RunRequest``
    traceparent: str = ""


class Credit(_Msg, tag="credit"):
    """The Edge has relayed ``chars`` more characters of a run's output: the Node may send
    that many more (R-IN-5)."""

    run_id: str
    chars: int


class Cancel(_Msg, tag="cancel"):
    run_id: str


class ConfigRefresh(_Msg, tag="config_refresh"):
    payload: NodePayload


class ErrorMessage(_Msg, tag="error"):
    """Sent by the Edge before it closes a connection for a reason the Node should log."""

    code: str
    message: str


NodeToEdge = Register | Ready | RunEvent | RunEnd | ProbeResult | ConfigRefreshAck | Ping | Pong
EdgeToNode = (
    RegisterResponse
    | RunBodyPart
    | RunRequest
    | TunnelRequest
    | Credit
    | Cancel
    | ConfigRefresh
    | Ping
    | Pong
    | ErrorMessage
)

_M = TypeVar("_M", bound=_Msg)
_encoder = msgspec.json.Encoder()
_from_node = msgspec.json.Decoder(NodeToEdge)
_from_edge = msgspec.json.Decoder(EdgeToNode)


def split(data: str, size: int = MAX_EVENT_DATA_CHARS) -> list[str]:
    """Pieces of at most ``size`` characters, in order (never splits a character)."""
    return [data[i : i + size] for i in range(0, len(data), size)] or [""]


def for_protocol(message: _M, protocol: int) -> _M:
    """``message`` without the fields ``FIELDS_SINCE`` says ``protocol`` does not have (set to
    their defaults, which are never encoded)."""
    newer = FIELDS_SINCE.get(str(message.__struct_config__.tag), {})
    drop = {name for name, since in newer.items() if since > protocol}
    if not drop:
        return message
    defaults = {f.name: f.default for f in msgspec.structs.fields(message) if f.name in drop}
    return msgspec.structs.replace(message, **defaults)


def edge_protocol(subprotocol: str | None) -> int:
    """The protocol a Node registers with and speaks to an Edge: 3 when the Edge chose
    ``WIRE_SUBPROTOCOL`` in the handshake, else 2 (what every Edge of 2 accepts)."""
    return PROTOCOL_VERSION if subprotocol == WIRE_SUBPROTOCOL else 2


def for_edge(message: _M, protocol: int) -> _M:
    """A Node's ``message`` for an Edge of ``protocol``: a usage without its cached input
    tokens for an Edge before 3 (every message refuses unknown fields). O(1): checked for
    every frame a Node sends."""
    if protocol >= 3 or type(message) is not RunEnd:
        return message
    usage = message.usage  # type: ignore[attr-defined]
    if usage is None or not usage.cached_input_tokens:
        return message
    plain = msgspec.structs.replace(usage, cached_input_tokens=0)
    return msgspec.structs.replace(message, usage=plain)


def encode(message: _Msg) -> bytes:
    return _encoder.encode(message)


def _decode(decoder: msgspec.json.Decoder[Any], frame: bytes | str) -> Any:
    try:
        return decoder.decode(frame)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise WireError(str(exc)) from None


def decode_from_node(frame: bytes | str) -> NodeToEdge:
    return _decode(_from_node, frame)  # type: ignore[no-any-return]


def decode_from_edge(frame: bytes | str) -> EdgeToNode:
    return _decode(_from_edge, frame)  # type: ignore[no-any-return]


def payload_revision(payload_without_revision: dict[str, Any]) -> str:
    """A short stable content hash for a node payload (sorted-key JSON)."""
    import hashlib

    raw = msgspec.json.encode(payload_without_revision, order="sorted")
    return hashlib.sha256(raw).hexdigest()[:16]
