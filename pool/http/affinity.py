"""A request's cache-affinity key (R-AFF-1, docs/pool.md "Cache affinity").

Per model group, ``affinity.key`` names what keys a conversation: OpenAI's
``prompt_cache_key``; ``user`` (Chat and Responses ``user``, Anthropic ``metadata.user_id``);
or ``prefix``, the conversation's head: its system prompt (``system``, ``instructions``) and
first message, as JSON, cut at ``PREFIX_BYTES``. What the pool sees is a digest of the group
and that text, never the text: a key of any length is stored as 32 hex characters.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from catalog.config import Affinity

PREFIX_BYTES = 4096  # of the conversation's head that a prefix key covers
_encode = msgspec.json.Encoder().encode


def affinity_of(
    group: str, affinity: Affinity | None, data: dict[str, Any]
) -> tuple[str, float] | None:
    """(key digest, ttl_s) for the pool, or None when the group has no affinity or the
    request carries no key."""
    if affinity is None:
        return None
    text = _key_text(affinity.key, data)
    if not text:
        return None
    digest = hashlib.blake2b(group.encode() + b"\0" + text, digest_size=16).hexdigest()
    return digest, float(affinity.ttl_s)


def _key_text(kind: str, data: dict[str, Any]) -> bytes | None:
    if kind == "prompt_cache_key":
        return _text(data.get("prompt_cache_key"))
    if kind == "user":
        metadata = data.get("metadata")
        user = metadata.get("user_id") if isinstance(metadata, dict) else None
        return _text(data.get("user")) or _text(user)
    conversation = data.get("messages", data.get("input"))
    first = conversation[:1] if isinstance(conversation, list) else conversation
    head = [data.get("system"), data.get("instructions"), first]
    if first is None or first == []:
        return None
    try:
        return _encode(head)[:PREFIX_BYTES]
    except (TypeError, ValueError):  # the body was decoded from JSON: cannot happen
        return None


def _text(value: Any) -> bytes | None:
    return value.encode() if isinstance(value, str) and value else None
