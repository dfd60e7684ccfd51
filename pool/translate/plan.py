"""Which translation, if any, a request takes on a provider (R-XLATE-1, R-PROF-4).

Admission: a provider's capabilities gain ``via:<capability>`` for every client operation it
can serve, natively or by translation. A request to a group with ``translate: true`` needs
``via:<capability>`` in place of the plain capability, so a Chat Completions provider is a
candidate for Anthropic Messages there; a group without it keeps the plain capability, and
the original rule holds exactly (R-PROF-7: GLM still serves no Responses).
"""

from __future__ import annotations

from collections.abc import Iterable

VIA = "via:"
# client capability -> provider capabilities that can serve it by translation
_TRANSLATED_FROM: dict[str, tuple[str, ...]] = {
    "messages": ("chat",),
    "chat": ("messages",),
    "responses": ("chat",),
    "count_tokens": ("chat", "messages"),  # by estimate where the provider has none
}


def served_capabilities(capabilities: Iterable[str]) -> frozenset[str]:
    """The provider's capabilities plus ``via:`` names of what it serves with translation."""
    own = frozenset(capabilities)
    via = {VIA + name for name in own if name in _TRANSLATED_FROM}
    for client, sources in _TRANSLATED_FROM.items():
        if any(source in own for source in sources):
            via.add(VIA + client)
    return own | via


_NEEDS: dict[tuple[frozenset[str], str], frozenset[str]] = {}


def translated_needs(needs: frozenset[str], capability: str) -> frozenset[str]:
    """The needs of a request to a translating group: ``capability`` becomes ``via:...``."""
    key = (needs, capability)
    found = _NEEDS.get(key)
    if found is None:
        found = _NEEDS[key] = (needs - {capability}) | {VIA + capability}
    return found


def route(operation: str, capabilities: frozenset[str]) -> str | None:
    """The translation a client ``operation`` takes on a provider, or None when native.

    Returns ``messages_via_chat``, ``chat_via_messages``, ``responses_via_chat`` or
    ``count_tokens_estimate``.
    """
    if operation == "messages" and "messages" not in capabilities:
        return "messages_via_chat"
    if operation == "chat_completions" and "chat" not in capabilities:
        return "chat_via_messages"
    if operation == "responses" and "responses" not in capabilities:
        return "responses_via_chat"
    if operation == "count_tokens" and "count_tokens" not in capabilities:
        return "count_tokens_estimate"
    return None
