"""The admin's managed-mode pages explain themselves (docs/admin.md): outside managed mode
Routes and Credential slots are not offered and say why, with no command-line flag; a
route's key is rotated only after a confirmation; the route list names the principal its
usage counts for."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from catalog.documents import document_to_catalog
from catalog.models import Route
from tests.support.managed import ManagedKeys, managed_document, mint_keys

pytestmark = pytest.mark.django_db

OFF = "Managed mode is off"
PAGES = ("catalog_route", "catalog_credentialslot")


@pytest.fixture
def keys(tmp_path: Path) -> ManagedKeys:
    return mint_keys(tmp_path / "keys", "n1")


@pytest.fixture
def managed(tmp_path: Path, keys: ManagedKeys) -> Path:
    path = tmp_path / "keyring.json"
    call_command("iop_keyring", "init", str(path), "--key-id", "k1", stdout=io.StringIO())
    document_to_catalog(managed_document(keys, path))
    return path


@pytest.fixture
def unmanaged(tmp_path: Path, keys: ManagedKeys) -> None:
    """The same catalog without ``credential_plane``: an Edge that is not in managed mode."""
    document: dict[str, Any] = managed_document(keys, tmp_path / "keyring.json")
    del document["credential_plane"]
    for node in document["nodes"]:
        node.pop("credential_recipient")
    document_to_catalog(document)


@pytest.fixture
def staff(client, django_user_model):
    user = django_user_model.objects.create(username="root", is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


def text(response: Any) -> str:
    return response.content.decode().replace("&#x27;", "'")


def test_outside_managed_mode_the_pages_are_not_offered_and_say_why(unmanaged, staff):
    index = text(staff.get(reverse("admin:index")))
    assert "Credential slots" not in index and "Routes" not in index
    assert "Protocol profiles" in index  # the rest of the catalog is still there
    for page in PAGES:
        listing = text(staff.get(reverse(f"admin:{page}_changelist")))
        assert OFF in listing and "credential_plane" in listing
        assert reverse(f"admin:{page}_add") not in listing  # no "Add" button
        added = staff.get(reverse(f"admin:{page}_add"), follow=True)
        assert added.redirect_chain == [(reverse(f"admin:{page}_changelist"), 302)]
        assert OFF in text(added) and "--keyring" not in text(added)


def test_outside_managed_mode_a_slot_post_changes_nothing_and_names_no_flag(unmanaged, staff):
    form = {"key": "web", "profile": "glm", "secret": "sk-canary"}
    response = staff.post(reverse("admin:catalog_credentialslot_add"), form, follow=True)
    assert OFF in text(response) and "--keyring" not in text(response)
    assert "sk-canary" not in text(response)


def test_the_command_outside_managed_mode_says_so_and_names_its_option(unmanaged):
    with pytest.raises(CommandError) as raised:
        call_command("iop_keyring", "rotate", "--key-id", "k2", stdout=io.StringIO())
    assert str(raised.value).startswith("managed mode is off")
    assert "--keyring FILE" in str(raised.value)


def test_in_managed_mode_the_pages_are_listed_without_the_notice(managed, staff):
    index = text(staff.get(reverse("admin:index")))
    assert "Credential slots" in index and "Routes" in index
    for page in PAGES:
        listing = text(staff.get(reverse(f"admin:{page}_changelist")))
        assert OFF not in listing and reverse(f"admin:{page}_add") in listing


def route(managed: Path, principal: str = "") -> tuple[Route, str]:
    with mock.patch("sys.stdin", io.TextIOWrapper(io.BytesIO(b"sk-slot"))):
        call_command("iop_slot", "set", "a", "--profile", "glm", stdout=io.StringIO())
    out = io.StringIO()
    extra = ["--principal-ref", principal] if principal else []
    call_command("iop_route", "create", "team", "--model", "glm", "--slot", "glm=a", *extra,
                 "--json", stdout=out)  # fmt: skip
    return Route.objects.get(key="team"), json.loads(out.getvalue())["key"]


def test_rotate_key_asks_first_and_only_a_confirmed_post_rotates(managed, staff):
    """R-AUTH-5: the change page links to a confirmation; a GET or an unconfirmed POST leaves
    the caller's key working; "Yes, rotate the key" rotates it."""
    row, _ = route(managed)
    rotate = reverse("admin:catalog_route_rotate_key", args=[row.pk])
    change = text(staff.get(reverse("admin:catalog_route_change", args=[row.pk])))
    assert f'href="{rotate}"' in change
    for asked in (staff.get(rotate), staff.post(rotate)):
        page = text(asked)
        assert asked.status_code == 200 and "stops working" in page
        assert 'id="confirm-rotate-key"' in page and 'id="route-key"' not in page
    before = row.key_hash_sha256
    row.refresh_from_db()
    assert (row.key_hash_sha256, row.revision) == (before, 1)
    done = staff.post(rotate, {"confirm": "yes"})
    assert 'id="route-key"' in text(done) and "no-store" in done["Cache-Control"]
    row.refresh_from_db()
    assert row.key_hash_sha256 != before and row.revision == 2


@pytest.mark.parametrize(("principal", "shown"), [("", "team (the route id)"), ("lab", "lab")])
def test_the_route_list_names_the_principal_its_usage_counts_for(managed, staff, principal, shown):
    route(managed, principal)
    listing = text(staff.get(reverse("admin:catalog_route_changelist")))
    assert f'<td class="field-principal">{shown}</td>' in listing
