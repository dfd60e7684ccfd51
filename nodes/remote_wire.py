"""The messages of run routing between Edges (docs/scale-out.md, "Run routing").

One JSON message per Redis stream entry (field ``m``), tagged by ``t``. Orders, body parts,
credit and cancels go to the owner's ``{P}:edge:{id}:{fence}:runs``; ``taken``, output and
the end go to the requester's ``{P}:edge:{id}:{fence}:replies``: a stream belongs to one
process of an Edge id (R-SCALE-4). No Django here.
"""

from __future__ import annotations

from typing import Any

import msgspec

from nodes import wire
from nodes.envelope import SlotGrant


class Msg(msgspec.Struct, tag_field="t", forbid_unknown_fields=True, omit_defaults=True):
    run_id: str


class Open(Msg, tag="open"):
    reply_to: str
    fence: str  # the requester's process (R-SCALE-4)
    node_id: str
    provider_id: str
    operation: str
    stream: bool
    tunnel: bool
    window: int
    body: str = ""
    body_parts: int = 0  # sent first as ``Part`` messages (R-IN-2)
    forward_headers: dict[str, str] = {}
    request_id: str = ""  # R-OBS-1, R-OBS-2: as in the Node's run messages
    traceparent: str = ""
    grant: SlotGrant | None = None  # managed mode: the owner issues the envelope (R-SCALE-7)


class Part(Msg, tag="part"):
    reply_to: str
    fence: str  # the requester's process (R-SCALE-4)
    data: str


class Credit(Msg, tag="credit"):
    reply_to: str
    fence: str  # the requester's process (R-SCALE-4)
    chars: int


class Cancel(Msg, tag="cancel"):
    reply_to: str
    fence: str  # the requester's process (R-SCALE-4)


class Taken(Msg, tag="taken"):
    """The owner read the order: the run is its now (or ends with an ``End``)."""


class Output(Msg, tag="out"):
    data: str


class End(Msg, tag="end"):
    ok: bool
    error: wire.RunError | None = None
    usage: wire.Usage | None = None


Message = Open | Part | Credit | Cancel | Taken | Output | End
encode = msgspec.json.Encoder().encode
decode = msgspec.json.Decoder(Message).decode
# R-COST-1: an End's cached input tokens travel in a field of their own beside ``m``: an Edge
# of an earlier version reads only ``m`` (whose usage refuses unknown fields), so a rolling
# upgrade keeps routing runs both ways (docs/scale-out.md, "Rolling upgrades").
CACHED_FIELD = b"c"


def entry(message: Msg) -> dict[Any, Any]:
    """The stream entry of ``message``."""
    usage = message.usage if isinstance(message, End) else None
    if usage is None or not usage.cached_input_tokens:
        return {b"m": encode(message)}
    plain = msgspec.structs.replace(usage, cached_input_tokens=0)
    return {
        b"m": encode(msgspec.structs.replace(message, usage=plain)),
        CACHED_FIELD: b"%d" % usage.cached_input_tokens,
    }


def read_entry(fields: dict[bytes, bytes]) -> Msg:
    """A stream entry's message (raises as ``decode`` does, or ``KeyError`` without ``m``)."""
    message: Msg = decode(fields[b"m"])
    cached = fields.get(CACHED_FIELD)
    if cached is not None and isinstance(message, End) and message.usage is not None:
        figure = int(cached) if cached.isdigit() else 0  # checked again by sane_usage
        message.usage = msgspec.structs.replace(message.usage, cached_input_tokens=figure)
    return message
