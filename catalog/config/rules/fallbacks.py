"""Fallback chains between model groups (R-FALL-1, R-FALL-2).

A group's chain is its ``fallbacks`` in order, each followed by that group's own chain, every
group once. A chain is refused at load when it loops back to a group already on the way,
names an unknown group, grows past ``MAX_FALLBACKS`` groups, or could carry a request between
GLM General and GLM Coding Plan providers (R-PROF-7b): the two plans keep separate usage
boundaries, so no fallback may cross them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from catalog.config.errors import Issues
from catalog.config.profiles import RuntimeProfile
from catalog.config.rules.context import Context
from catalog.config.schema import ModelDoc
from catalog.config.schema.catalog import MAX_FALLBACKS

GLM_PLANS = {"glm": "GLM General", "glm_coding": "GLM Coding Plan"}


class FallbackLoop(Exception):
    """A chain that comes back to a group on its own way."""

    def __init__(self, way: list[str]) -> None:
        super().__init__(" -> ".join(way))


def fallback_chain(group: str, declared: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """The groups tried after ``group``, in order (depth first, each once); ``declared`` maps a
    group id to its ``fallbacks``. Raises ``FallbackLoop``; unknown ids are skipped here (the
    rule below refuses them)."""
    chain: list[str] = []

    def walk(current: str, way: list[str]) -> None:
        for nxt in declared.get(current, ()):
            if nxt in way:
                raise FallbackLoop([*way, nxt])
            if nxt not in declared:
                continue
            if nxt not in chain:
                chain.append(nxt)
            walk(nxt, [*way, nxt])

    walk(group, [group])
    chain_without_self = [g for g in chain if g != group]
    return tuple(chain_without_self)


def check_fallbacks(ctx: Context, issues: Issues) -> None:
    """R-FALL-2: known groups, no loop, at most ``MAX_FALLBACKS`` groups, no GLM crossing."""
    models = [(item, item.doc) for item in ctx.parsed.models if isinstance(item.doc, ModelDoc)]
    declared = {doc.id: doc.fallbacks for _, doc in models}
    plans = _group_plans(ctx, [doc for _, doc in models])
    for item, doc in models:
        for index, target in enumerate(doc.fallbacks):
            if target not in declared:
                issues.add((*item.path, "fallbacks", index), f"unknown model group {target!r}")
        if not doc.fallbacks:
            continue
        try:
            chain = fallback_chain(doc.id, declared)
        except FallbackLoop as loop:
            issues.add((*item.path, "fallbacks"), f"the fallback chain loops: {loop}")
            continue
        if len(chain) > MAX_FALLBACKS:
            issues.add(
                (*item.path, "fallbacks"),
                f"the fallback chain reaches {len(chain)} groups (at most {MAX_FALLBACKS})",
            )
        crossing = {plan for group in (doc.id, *chain) for plan in plans.get(group, ())}
        if len(crossing) > 1:
            issues.add(
                (*item.path, "fallbacks"),
                "the fallback chain could route between GLM General and GLM Coding Plan "
                "providers (R-PROF-7b): keep their groups in separate chains",
            )


def _group_plans(ctx: Context, models: list[ModelDoc]) -> dict[str, set[str]]:
    """The GLM plans (General, Coding Plan) each group's providers belong to."""
    provider_plan: dict[str, str] = {}
    for item, doc in ctx.valid_providers():
        profile = ctx.provider_profiles.get(item.path)
        plan = _glm_plan(profile, ctx.catalog) if profile is not None else None
        if plan is not None:
            provider_plan[doc.id] = plan
    return {
        doc.id: {provider_plan[p] for p in doc.providers if p in provider_plan} for doc in models
    }


def _glm_plan(profile: RuntimeProfile, catalog: Mapping[str, RuntimeProfile]) -> str | None:
    """``glm`` or ``glm_coding`` when the profile is (or derives from) a built-in GLM one."""
    seen: set[str] = set()
    current: RuntimeProfile | None = profile
    while current is not None and current.name not in seen:
        if current.name in GLM_PLANS:
            return current.name
        seen.add(current.name)
        current = catalog.get(current.base) if current.base else None
    return None
