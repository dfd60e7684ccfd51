"""Budgets belong to the principal (R-BUD-1): a budget stated on one of its tokens holds for
every token of that principal, so which token a request used never changes what it may spend.
State it on one token; tokens that state one too must state the same."""

from __future__ import annotations

from catalog.config.errors import Issues, format_path
from catalog.config.rules.context import Context


def check_budgets(ctx: Context, issues: Issues) -> None:
    """Tokens of one principal that state a budget state the same one, and the same as the
    principal's own entry in ``principals:`` when it has one (R-MGD-13); a principal's
    ``max_queued`` fits the queue."""
    principals = {item.doc.id: item for item in ctx.parsed.principals if item.doc is not None}
    for item in principals.values():
        assert item.doc is not None
        if item.doc.max_queued is not None and item.doc.max_queued > ctx.max_queue:
            issues.add(
                (*item.path, "max_queued"),
                f"must not exceed provider_pool.max_queue ({ctx.max_queue})",
            )
    openai = ctx.openai
    if openai is None:
        return
    first: dict[str, int] = {}
    for index, token in enumerate(openai.principal_tokens):
        if token.budget is None:
            continue
        entry = principals.get(token.principal_ref)
        if entry is not None:
            assert entry.doc is not None
            if entry.doc.budget != token.budget:
                issues.add(
                    ("openai", "principal_tokens", index, "budget"),
                    f"differs from the budget of principal {token.principal_ref!r} at "
                    f"{format_path((*entry.path, 'budget'))}: a budget is the principal's; "
                    "state it there",
                )
            continue
        at = first.setdefault(token.principal_ref, index)
        if openai.principal_tokens[at].budget != token.budget:
            where = format_path(("openai", "principal_tokens", at))
            issues.add(
                ("openai", "principal_tokens", index, "budget"),
                f"differs from the budget of principal {token.principal_ref!r} at {where}: "
                "a budget is the principal's; state it on one of its tokens",
            )
