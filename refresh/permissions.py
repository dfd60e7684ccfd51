"""Who may do what with config revisions: one table for the admin and the REST API.

Staff only, then Django's model permissions on ``ConfigRevision`` (docs/refresh.md):
reading (list, detail, diff, dry-run) needs ``view`` or ``change``, as in the Django admin;
creating a revision needs ``add``; apply and stage need ``change``.
"""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission

VIEW = "refresh.view_configrevision"
ADD = "refresh.add_configrevision"
CHANGE = "refresh.change_configrevision"

# What each kind of use needs; ``view`` is satisfied by ``change`` too (the admin's rule).
NEEDS = {"view": (VIEW, CHANGE), "add": (ADD,), "change": (CHANGE,)}

# REST API actions of the revision viewset -> kind of use.
API_ACTIONS = {
    "list": "view",
    "retrieve": "view",
    "diff": "view",
    "dry_run": "view",
    "create": "add",
    "from_catalog": "add",
    "apply": "change",
    "stage": "change",
}


def may(user: Any, use: str) -> bool:
    """True when ``user`` is active staff and holds a permission that grants ``use``."""
    if not (user and user.is_authenticated and user.is_active and user.is_staff):
        return False
    return any(user.has_perm(perm) for perm in NEEDS[use])


class RevisionPermission(BasePermission):
    """The REST API's check: staff, then the action's model permission (``API_ACTIONS``).

    An action missing from the table is refused (a new action must be classified here).
    """

    def has_permission(self, request: Any, view: Any) -> bool:
        use = API_ACTIONS.get(getattr(view, "action", None) or "")
        if use is None:
            return False
        return may(request.user, use)
