"""Credential slots, routes, the keyring and managed keys in the catalog, through the
commands an operator runs (R-MGD-2, R-MGD-3, R-MGD-6, R-AUTH-4)."""

from __future__ import annotations

import hashlib
import io
import json
import stat
from pathlib import Path
from unittest import mock

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from catalog.documents import document_to_catalog
from catalog.keyring import Keyring, new_keyring
from catalog.models import CredentialSlot, Route
from tests.support.managed import ManagedKeys, managed_document, mint_keys

pytestmark = pytest.mark.django_db

SECRET = "sk-slot-canary-0b5e2a91"


@pytest.fixture
def keys(tmp_path) -> ManagedKeys:
    return mint_keys(tmp_path / "keys", "n1")


@pytest.fixture
def keyring_file(tmp_path, keys) -> Path:
    path = tmp_path / "keyring.json"
    call_command("iop_keyring", "init", str(path), "--key-id", "k1", stdout=io.StringIO())
    document_to_catalog(managed_document(keys, path))
    return path


def set_slot(slot: str, profile: str, secret: str = SECRET) -> str:
    """``iop_slot set`` with ``secret`` on its stdin; what it printed."""
    out = io.StringIO()
    with mock.patch("sys.stdin", io.TextIOWrapper(io.BytesIO(secret.encode()))):
        call_command("iop_slot", "set", slot, "--profile", profile, stdout=out)
    return out.getvalue()


def create_route(*args: str) -> str:
    out = io.StringIO()
    call_command("iop_route", "create", *args, "--json", stdout=out)
    return json.loads(out.getvalue())["key"]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_iop_keys_writes_the_issuer_key_0600_and_never_overwrites_r_auth_4_r_tls_5(tmp_path):
    """R-AUTH-4, R-TLS-5: the issuer pair (Ed25519), the private key created exclusively 0600."""
    out = tmp_path / "k"
    call_command("iop_keys", "issuer", "--out", str(out), stdout=io.StringIO())
    assert mode(out / "issuer.key") == 0o600
    assert b"BEGIN PUBLIC KEY" in (out / "issuer.pub").read_bytes()
    before = (out / "issuer.key").read_bytes()
    with pytest.raises(CommandError, match="exists; keys are never overwritten"):
        call_command("iop_keys", "issuer", "--out", str(out), stdout=io.StringIO())
    assert (out / "issuer.key").read_bytes() == before


def test_a_slot_secret_is_stored_only_sealed_and_its_revision_bumps_r_mgd_2(keyring_file):
    """R-MGD-2: the secret comes from stdin, is sealed under the keyring (newest key), and
    every change bumps the slot's credential revision."""
    assert "credential revision 1" in set_slot("glm-a", "glm")
    slot = CredentialSlot.objects.get(key="glm-a")
    assert SECRET not in slot.sealed and slot.sealed.startswith("v1:k1:")
    assert Keyring.load(keyring_file).open(slot.sealed, "glm-a") == SECRET.encode()
    set_slot("glm-a", "glm", "sk-another-secret")
    slot.refresh_from_db()
    assert slot.credential_revision == 2
    assert Keyring.load(keyring_file).open(slot.sealed, "glm-a") == b"sk-another-secret"


def test_a_slot_for_an_unknown_profile_or_an_empty_secret_is_refused_r_mgd_2(keyring_file):
    with pytest.raises(CommandError, match="unknown profile 'nope'"):
        set_slot("s", "nope")
    with pytest.raises(CommandError, match="the secret is empty"):
        set_slot("s", "glm", "  \n")
    stdin = io.TextIOWrapper(io.BytesIO(b"\xff\xfe"))
    with (
        pytest.raises(CommandError, match="the secret is not UTF-8 text"),
        mock.patch("sys.stdin", stdin),
    ):
        call_command("iop_slot", "set", "s", "--profile", "glm", stdout=io.StringIO())
    assert not CredentialSlot.objects.exists()


def test_a_route_key_is_printed_once_and_only_its_sha256_stored_r_mgd_3(keyring_file):
    """R-MGD-3: the raw key is returned once; the row holds its sha256 and the bindings."""
    set_slot("glm-a", "glm")
    key = create_route("team-a", "--model", "glm", "--slot", "glm=glm-a")
    route = Route.objects.get(key="team-a")
    assert route.key_hash_sha256 == hashlib.sha256(key.encode()).hexdigest()
    assert key not in json.dumps(list(Route.objects.values()))
    assert [str(b) for b in route.slots.all()] == ["glm=glm-a"]


def test_a_route_naming_an_unknown_slot_is_refused(keyring_file):
    with pytest.raises(CommandError, match="unknown slot 'missing'"):
        create_route("r", "--model", "glm", "--slot", "glm-general=missing")
    assert not Route.objects.exists()


def test_a_route_using_a_slot_of_the_other_glm_family_is_refused_r_mgd_6(keyring_file):
    """R-MGD-6: a GLM General slot never serves a GLM Coding Plan provider, nor the reverse;
    a profile target covering a provider of the other family is refused too."""
    set_slot("general", "glm")
    set_slot("coding", "glm_coding")
    with pytest.raises(CommandError, match="slot 'general' is for profile family 'glm'"):
        create_route("r", "--model", "glm", "--slot", "glm-coding=general")
    with pytest.raises(CommandError, match="slot 'coding' is for profile family 'glm_coding'"):
        create_route("r", "--model", "glm", "--slot", "glm=coding")
    assert not Route.objects.exists()
    create_route("ok", "--model", "glm", "--slot", "glm=general", "--slot", "glm-coding=coding")


def test_a_route_for_an_unknown_group_or_a_provider_outside_it_is_refused(keyring_file):
    set_slot("coding", "glm_coding")
    with pytest.raises(CommandError, match="unknown model group 'nope'"):
        create_route("r", "--model", "nope", "--slot", "glm-coding=coding")
    with pytest.raises(CommandError, match="'glm-general' is neither a provider of 'coder'"):
        create_route("r", "--model", "coder", "--slot", "glm-general=coding")


def test_rotation_adds_a_key_and_reseals_every_slot_r_mgd_2(keyring_file):
    """R-MGD-2: rotate adds the newest key, keeps the old ones, re-seals every slot with the
    new key; the secrets are unchanged."""
    set_slot("a", "glm")
    set_slot("b", "glm_coding", "sk-b-secret")
    out = io.StringIO()
    call_command("iop_keyring", "rotate", "--key-id", "k2", stdout=out)
    assert "2 slot(s) re-sealed" in out.getvalue()
    keyring = Keyring.load(keyring_file)
    assert keyring.key_ids == ("k1", "k2") and mode(keyring_file) == 0o600
    a, b = CredentialSlot.objects.order_by("key")
    assert a.sealed.startswith("v1:k2:") and b.sealed.startswith("v1:k2:")
    assert keyring.open(a.sealed, "a") == SECRET.encode()
    assert keyring.open(b.sealed, "b") == b"sk-b-secret"


def test_rotation_with_a_keyring_missing_a_key_id_changes_nothing(keyring_file):
    """A slot sealed under a key the keyring lost: rotation is refused, naming the key id."""
    set_slot("a", "glm")
    keyring_file.write_text(new_keyring("other").dump())  # k1 is gone
    sealed = CredentialSlot.objects.get().sealed
    with pytest.raises(CommandError, match="sealed under key 'k1', not in the keyring"):
        call_command("iop_keyring", "rotate", "--key-id", "k2", stdout=io.StringIO())
    assert CredentialSlot.objects.get().sealed == sealed
    assert Keyring.load(keyring_file).key_ids == ("other",)


def test_a_corrupted_keyring_file_is_refused_naming_the_file(keyring_file):
    keyring_file.write_text("{not json")
    with pytest.raises(CommandError, match=f"the keyring file {keyring_file} is not a JSON"):
        set_slot("a", "glm")
    assert not CredentialSlot.objects.exists()


def test_a_slot_secret_never_appears_in_dumpdata_or_the_config_export_r_mgd_2(keyring_file):
    """R-MGD-2, R-AUTH-6: slots are outside the config document; the database dump holds
    only the sealed value."""
    set_slot("a", "glm")
    create_route("team", "--model", "glm", "--slot", "glm=a")
    dump = io.StringIO()
    call_command("dumpdata", stdout=dump)
    assert SECRET not in dump.getvalue()
    assert "v1:k1:" in dump.getvalue()  # the sealed value is there, which proves the dump saw it
    export = io.StringIO()
    call_command("iop_config", "export", stdout=export)
    assert SECRET not in export.getvalue()
    assert "glm=a" not in export.getvalue()  # routes are not config either


@pytest.fixture
def staff(client, django_user_model):
    user = django_user_model.objects.create(username="root", is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


def test_the_admin_takes_a_slot_secret_write_only_r_mgd_2(keyring_file, staff):
    """R-MGD-2: the admin seals the secret it is given and never renders it back; saving
    without a secret keeps the old one."""
    add = reverse("admin:catalog_credentialslot_add")
    assert 'type="password"' in staff.get(add).content.decode()
    response = staff.post(add, {"key": "web", "profile": "glm", "secret": SECRET})
    assert response.status_code == 302
    slot = CredentialSlot.objects.get(key="web")
    assert Keyring.load(keyring_file).open(slot.sealed, "web") == SECRET.encode()
    change = reverse("admin:catalog_credentialslot_change", args=[slot.pk])
    page = staff.get(change).content.decode()
    assert SECRET not in page and slot.sealed not in page
    assert staff.post(change, {"key": "web", "secret": ""}).status_code == 302
    slot.refresh_from_db()
    assert slot.credential_revision == 1
    assert Keyring.load(keyring_file).open(slot.sealed, "web") == SECRET.encode()
    staff.post(change, {"key": "web", "secret": "sk-admin-new"})
    slot.refresh_from_db()
    assert slot.credential_revision == 2


def test_the_admin_lists_routes_without_their_keys_r_mgd_3(keyring_file, staff):
    set_slot("a", "glm")
    key = create_route("team", "--model", "glm", "--slot", "glm=a")
    route = Route.objects.get()
    page = staff.get(reverse("admin:catalog_route_changelist")).content.decode()
    assert "team" in page and "glm=a" in page and key not in page
    change = reverse("admin:catalog_route_change", args=[route.pk])
    assert key not in staff.get(change).content.decode()
    data = {
        "principal_ref": "research",
        "enabled": "",
        "slots-TOTAL_FORMS": "1",
        "slots-INITIAL_FORMS": "1",
        "slots-MIN_NUM_FORMS": "0",
        "slots-MAX_NUM_FORMS": "1000",
        "slots-0-id": str(route.slots.get().pk),
        "slots-0-route": str(route.pk),
    }
    assert staff.post(change, data).status_code == 302
    route.refresh_from_db()
    assert (route.principal_ref, route.enabled, route.revision) == ("research", False, 2)


def test_the_admin_creates_a_route_and_shows_its_key_once_r_mgd_3(keyring_file, staff):
    """R-MGD-3: a route made in the admin, checked like `iop_route create`; the answer to the
    POST carries the key (never cached), the row only its sha256, no later page the key."""
    set_slot("a", "glm")
    add = reverse("admin:catalog_route_add")
    form = {"key": "team", "model_group": "glm", "slots": "glm=a\n", "principal_ref": ""}
    response = staff.post(add, form)
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    page = response.content.decode()
    key = page.split('id="route-key"', 1)[1].split(">", 1)[1].split("<", 1)[0]
    assert key.startswith("iop_route_") and "It is shown only now" in page
    route = Route.objects.get(key="team")
    assert route.key_hash_sha256 == hashlib.sha256(key.encode()).hexdigest()
    assert [str(b) for b in route.slots.all()] == ["glm=a"]
    change = reverse("admin:catalog_route_change", args=[route.pk])
    for url in (change, reverse("admin:catalog_route_changelist")):
        assert key not in staff.get(url).content.decode()
    assert key not in json.dumps(list(Route.objects.values()))


def test_the_admin_refuses_a_route_the_command_would_refuse_r_mgd_6(keyring_file, staff):
    """R-MGD-6: the same checks as the command, as form errors; nothing is created."""
    set_slot("coding", "glm_coding")
    add = reverse("admin:catalog_route_add")
    form = {"key": "r", "model_group": "glm", "slots": "glm=coding", "principal_ref": ""}
    page = staff.post(add, form).content.decode()
    assert "slot &#x27;coding&#x27; is for profile family &#x27;glm_coding&#x27;" in page
    form = {**form, "key": "bad id!", "slots": "glm-coding=coding", "model_group": "coder"}
    assert "route id &#x27;bad id!&#x27; must be" in staff.post(add, form).content.decode()
    assert not Route.objects.exists()


def test_the_admin_rotates_a_route_key_shown_once_r_mgd_3(keyring_file, staff):
    """R-MGD-3, R-AUTH-5: a new key replaces the old one (only its sha256 stored) and the
    route revision goes up; a GET only asks (tests/test_admin_managed_pages.py)."""
    set_slot("a", "glm")
    old = create_route("team", "--model", "glm", "--slot", "glm=a")
    route = Route.objects.get()
    rotate = reverse("admin:catalog_route_rotate_key", args=[route.pk])
    assert 'id="route-key"' not in staff.get(rotate).content.decode()
    change_page = staff.get(reverse("admin:catalog_route_change", args=[route.pk]))
    assert rotate in change_page.content.decode()
    response = staff.post(rotate, {"confirm": "yes"})
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    page = response.content.decode()
    new = page.split('id="route-key"', 1)[1].split(">", 1)[1].split("<", 1)[0]
    assert new.startswith("iop_route_") and new != old
    assert "The previous key no longer works" in page
    route.refresh_from_db()
    assert route.key_hash_sha256 == hashlib.sha256(new.encode()).hexdigest()
    assert route.revision == 2


def test_iop_route_rotate_prints_the_new_key_once_r_mgd_3(keyring_file):
    set_slot("a", "glm")
    old = create_route("team", "--model", "glm", "--slot", "glm=a")
    out = io.StringIO()
    call_command("iop_route", "rotate", "team", "--json", stdout=out)
    new = json.loads(out.getvalue())["key"]
    route = Route.objects.get()
    assert new != old and route.key_hash_sha256 == hashlib.sha256(new.encode()).hexdigest()
    with pytest.raises(CommandError, match="no route 'nope'"):
        call_command("iop_route", "rotate", "nope", stdout=io.StringIO())


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"key": "bad id!", "profile": "glm", "secret": SECRET}, "slot id 'bad id!' must be"),
        ({"key": "", "profile": "glm", "secret": SECRET}, "This field is required"),
        ({"key": "k" * 101, "profile": "glm", "secret": SECRET}, "at most 100 characters"),
        ({"key": "web", "profile": "nope", "secret": SECRET}, "unknown profile 'nope'"),
        ({"key": "web", "profile": "glm", "secret": ""}, "a new slot needs its secret"),
        ({"key": "web", "profile": "glm", "secret": "   \n"}, "the secret is empty"),
        ({"key": "web", "profile": "glm", "secret": "s" * 16385}, "larger than 16384 bytes"),
        # 6000 characters pass a character count, but are 18000 bytes of UTF-8
        ({"key": "web", "profile": "glm", "secret": "€" * 6000}, "larger than 16384 bytes"),
        ({"key": "taken", "profile": "glm", "secret": SECRET}, "already exists"),
    ],
)
def test_the_admin_slot_form_answers_each_bad_value_with_a_form_error(
    keyring_file, staff, data, error
):
    """The slot form checks every value it saves (iop_slot set's rules): a bad id, profile
    or secret is a form error on the page (200), never a 500; nothing is saved and the
    secret is not rendered back."""
    set_slot("taken", "glm")
    before = list(CredentialSlot.objects.values_list("key", "sealed", "credential_revision"))
    response = staff.post(reverse("admin:catalog_credentialslot_add"), data)
    assert response.status_code == 200
    page = response.content.decode()
    assert error in page.replace("&#x27;", "'")
    assert data["secret"].strip() == "" or data["secret"] not in page
    after = list(CredentialSlot.objects.values_list("key", "sealed", "credential_revision"))
    assert after == before


def test_a_route_giving_a_slot_to_a_cli_provider_without_credential_env_is_refused_r_mgd_11(
    tmp_path, keys
):
    """R-MGD-11: a cli provider takes its slot secret only in the environment variable it
    names; without one the route is refused (the secret would go nowhere, never in argv)."""
    path = tmp_path / "keyring.json"
    call_command("iop_keyring", "init", str(path), "--key-id", "k1", stdout=io.StringIO())
    document = managed_document(keys, path)
    document["nodes"][0]["providers"] += [
        {"id": "tool-bare", "profile": "cli", "command": ["tool"]},
        {"id": "tool-env", "profile": "cli", "command": ["tool"], "credential_env": "TOOL_KEY"},
    ]
    document["models"].append({"id": "tool", "providers": {"tool-bare": "t", "tool-env": "t"}})
    document_to_catalog(document)
    set_slot("tool-slot", "cli")
    with pytest.raises(CommandError, match="'tool-bare' is a cli provider without credential_env"):
        create_route("r1", "--model", "tool", "--slot", "tool-bare=tool-slot")
    assert create_route("r2", "--model", "tool", "--slot", "tool-env=tool-slot")


def test_iop_keys_node_registers_a_public_key_made_on_the_node_r_tls_5(tmp_path, capsys):
    """R-TLS-5: the Edge never makes a Node's private key: `iop_keys node` takes the public
    key `iop-node keygen` printed, refuses a private key or another kind, and prints the
    credential_recipient entry with the key id both sides derive."""
    from nodes.agent.main import main as iop_node

    assert iop_node(["keygen", "--out", str(tmp_path / "node")]) == 0
    kid = next(
        line.split(": ")[1]
        for line in capsys.readouterr().out.splitlines()
        if "recipient_key_id:" in line
    )
    out = io.StringIO()
    edge = tmp_path / "edge"
    pub = tmp_path / "node" / "recipient.pub"
    call_command("iop_keys", "node", "n1", "--public-key", str(pub), "--out", str(edge), stdout=out)
    assert f"key id {kid}" in out.getvalue()
    assert f"credential_recipient: {{key_id: {kid}, public_key_file: " in out.getvalue()
    assert (edge / "n1.pub").read_bytes() == pub.read_bytes()
    assert list(edge.iterdir()) == [edge / "n1.pub"]  # no private key on the Edge
    for bad, message in [
        (tmp_path / "node" / "recipient.key", "that is a private key: it stays on the Node"),
        (tmp_path / "issuer.pub", "is not an X25519 key"),
    ]:
        if bad.name == "issuer.pub":
            call_command("iop_keys", "issuer", "--out", str(tmp_path), stdout=io.StringIO())
        with pytest.raises(CommandError, match=message):
            call_command(
                "iop_keys", "node", "n2", "--public-key", str(bad), "--out", str(edge),
                stdout=io.StringIO(),
            )  # fmt: skip
    with pytest.raises(CommandError, match="exists; keys are never overwritten"):
        call_command("iop_keys", "node", "n1", "--public-key", str(pub), "--out", str(edge))
