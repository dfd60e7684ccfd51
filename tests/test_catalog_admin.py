"""Django admin for the catalog: every save and delete is checked on the whole catalog (R-CFG-5)."""

from __future__ import annotations

from typing import Any

import pytest
from django import forms
from django.contrib.messages import get_messages
from django.urls import reverse

from catalog.config import parse_text
from catalog.documents import catalog_to_document, document_to_catalog
from catalog.models import EdgeSettings, ModelGroup, Node, PrincipalToken, ProtocolProfile, Provider
from tests.support.processes import EDGE_YAML

pytestmark = pytest.mark.django_db


@pytest.fixture
def catalog() -> dict:
    document_to_catalog(parse_text(EDGE_YAML.read_text()))
    return catalog_to_document()


@pytest.fixture
def staff(client, django_user_model):
    # No password: hashing one costs most of a test's time; the session login is enough.
    user = django_user_model.objects.create(username="root", is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


def _value(field: forms.Field, value: Any) -> Any:
    if isinstance(field, forms.NullBooleanField):
        return {True: "true", False: "false"}.get(value, "unknown")
    return "" if value is None else value


def page_data(response) -> dict[str, Any]:
    """The POST body the admin change page would send back unchanged (form, inlines)."""
    page_forms = [response.context["adminform"].form]
    for inline in response.context["inline_admin_formsets"]:
        page_forms.append(inline.formset.management_form)
        page_forms.extend(inline.formset.forms)
    data: dict[str, Any] = {}
    for form in page_forms:
        for name, field in form.fields.items():
            bound = form[name]
            if isinstance(field, forms.BooleanField) and not isinstance(
                field, forms.NullBooleanField
            ):
                if bound.value():
                    data[bound.html_name] = "on"
                continue
            data[bound.html_name] = _value(field, bound.value())
    return data


def change_url(obj) -> str:
    return reverse(f"admin:catalog_{obj._meta.model_name}_change", args=[obj.pk])


def test_inline_provider_capacity_zero_is_refused_with_its_path_and_nothing_saved(staff, catalog):
    node = Node.objects.get(key="node-local")
    data = page_data(staff.get(change_url(node)))
    assert data["providers-0-key"] == "ollama-local"
    data["providers-0-capacity"] = "0"
    data["alias"] = "renamed"
    response = staff.post(change_url(node), data)
    assert response.status_code == 200
    assert b"nodes[0].providers[0].capacity" in response.content
    assert catalog_to_document() == catalog
    assert Node.objects.get(key="node-local").alias == "workstation"


def test_every_error_of_a_refused_edit_is_shown(staff, catalog):
    node = Node.objects.get(key="node-local")
    data = page_data(staff.get(change_url(node)))
    data["providers-0-capacity"] = "0"
    data["providers-2-capacity"] = "-3"
    content = staff.post(change_url(node), data).content
    assert b"nodes[0].providers[0].capacity" in content
    assert b"nodes[0].providers[2].capacity" in content
    assert catalog_to_document() == catalog


def test_a_valid_inline_edit_is_saved(staff, catalog):
    node = Node.objects.get(key="node-local")
    data = page_data(staff.get(change_url(node)))
    data["providers-1-capacity"] = "8"
    response = staff.post(change_url(node), data)
    assert response.status_code == 302
    assert Provider.objects.get(key="vllm-local").capacity == 8
    assert catalog_to_document()["nodes"][0]["providers"][1]["capacity"] == 8


def test_edge_settings_threshold_zero_is_refused_with_its_path(staff, catalog):
    settings = EdgeSettings.objects.get()
    data = page_data(staff.get(change_url(settings)))
    data["long_context_threshold_tokens"] = "0"
    response = staff.post(change_url(settings), data)
    assert b"openai.long_context_threshold_tokens" in response.content
    assert EdgeSettings.objects.get().long_context_threshold_tokens == 100000


def test_provider_pointing_at_an_unknown_profile_is_refused(staff, catalog):
    provider = Provider.objects.get(key="vllm-local")
    data = page_data(staff.get(change_url(provider)))
    data["profile"] = "no_such_profile"
    response = staff.post(change_url(provider), data)
    assert b"nodes[0].providers[1].profile" in response.content
    assert Provider.objects.get(key="vllm-local").profile == "local_vllm"


def test_model_group_inline_mapping_edit_is_saved_in_document_order(staff, catalog):
    group = ModelGroup.objects.get(key="qwen-local")
    data = page_data(staff.get(change_url(group)))
    assert data["targets-TOTAL_FORMS"] == 2
    data["targets-1-served_model"] = "qwen2.5:7b-instruct"
    assert staff.post(change_url(group), data).status_code == 302
    providers = catalog_to_document()["models"][0]["providers"]
    assert providers == {
        "vllm-local": "Qwen/Qwen2.5-7B-Instruct",
        "ollama-local": "qwen2.5:7b-instruct",
    }
    assert list(providers) == ["vllm-local", "ollama-local"]


def test_fallbacks_are_edited_on_the_group_and_a_loop_is_refused(staff, catalog):
    """R-FALL-1, R-FALL-2: the column holds the list; a chain back to the group is refused
    whole, naming the path."""
    group = ModelGroup.objects.get(key="qwen-local")
    data = page_data(staff.get(change_url(group)))
    data["fallbacks"] = '["echo"]'
    assert staff.post(change_url(group), data).status_code == 302
    assert catalog_to_document()["models"][0]["fallbacks"] == ["echo"]
    echo = ModelGroup.objects.get(key="echo")
    back = page_data(staff.get(change_url(echo)))
    back["fallbacks"] = '["qwen-local"]'
    response = staff.post(change_url(echo), back)
    assert response.status_code == 200
    assert b"the fallback chain loops" in response.content


def test_inline_mapping_against_the_profile_model_mapping_is_refused(staff, catalog):
    """R-PROF-5: a served model must agree with the profile's model_mapping."""
    group = ModelGroup.objects.get(key="qwen-local")
    data = page_data(staff.get(change_url(group)))
    data["targets-0-served_model"] = "Qwen/Qwen2.5-7B-Instruct-AWQ"
    response = staff.post(change_url(group), data)
    assert b"models[0].providers.vllm-local" in response.content
    assert catalog_to_document() == catalog


def test_deleting_a_profile_still_in_use_is_refused(staff, catalog):
    profile = ProtocolProfile.objects.get(name="local_vllm")
    url = reverse("admin:catalog_protocolprofile_delete", args=[profile.pk])
    response = staff.post(url, {"post": "yes"})
    assert response.status_code == 302
    assert ProtocolProfile.objects.filter(name="local_vllm").exists()
    shown = [str(message) for message in get_messages(response.wsgi_request)]
    assert any(line.startswith("nodes[0].providers[1].profile") for line in shown)


def test_bulk_delete_that_breaks_the_catalog_is_refused(staff, catalog):
    profile = ProtocolProfile.objects.get(name="local_vllm")
    url = reverse("admin:catalog_protocolprofile_changelist")
    data = {"action": "delete_selected", "_selected_action": [profile.pk], "post": "yes"}
    response = staff.post(url, data)
    assert response.status_code == 302
    assert ProtocolProfile.objects.filter(name="local_vllm").exists()
    assert catalog_to_document() == catalog


def test_settings_json_may_not_repeat_a_key_that_has_a_field(staff, catalog):
    provider = Provider.objects.get(key="vllm-local")
    data = page_data(staff.get(change_url(provider)))
    data["settings"] = '{"capacity": 2}'
    response = staff.post(change_url(provider), data)
    assert b"keys that have their own field here: capacity" in response.content
    assert catalog_to_document() == catalog


@pytest.mark.parametrize(
    ("model", "query"),
    [
        ("provider", "?enabled__exact=1&q=vllm"),
        ("provider", "?profile=ollama"),
        ("node", "?q=workstation"),
        ("modelgroup", "?q=qwen"),
        ("protocolprofile", ""),
        ("principaltoken", "?q=app"),
        ("edgesettings", ""),
    ],
)
def test_changelists_render_with_search_and_filters(staff, catalog, model, query):
    response = staff.get(reverse(f"admin:catalog_{model}_changelist") + query)
    assert response.status_code == 200


def test_provider_list_filters_by_enabled_node_and_profile(staff, catalog):
    url = reverse("admin:catalog_provider_changelist")
    node = Node.objects.get(key="node-local")
    response = staff.get(
        url, {"enabled__exact": "1", "node__id__exact": node.pk, "profile": "ollama"}
    )
    shown = [row.key for row in response.context["cl"].result_list]
    assert shown == ["ollama-local"]


def test_principal_token_form_holds_a_hash_and_says_how_to_mint(staff, catalog):
    token = PrincipalToken.objects.get(token_ref="app-ci")
    response = staff.get(change_url(token))
    form = response.context["adminform"].form
    assert "iop_token" in form.fields["token_hash_sha256"].help_text
    assert set(form.fields) == {
        "token_ref",
        "principal_ref",
        "alias",
        "token_hash_sha256",
        "model_groups",
        "max_in_flight",
        "max_queued",
        "rpm",
        "tpm",
        "budget",
        "settings",
        "order",
    }


def test_principal_token_policy_is_edited_per_token_and_exported(staff, catalog):
    """R-PRIN-1..3: scope from the configured groups, limits as numbers, in the document."""
    token = PrincipalToken.objects.get(token_ref="app-ci")
    response = staff.get(change_url(token))
    choices = [key for key, _ in response.context["adminform"].form.fields["model_groups"].choices]
    assert choices == [m["id"] for m in catalog["models"]]
    data = page_data(response)
    data.update({"model_groups": ["echo"], "max_in_flight": "2", "rpm": "30", "tpm": "9000"})
    data["max_queued"] = "4"
    assert staff.post(change_url(token), data).status_code == 302
    entry = catalog_to_document()["openai"]["principal_tokens"][1]
    assert entry["token_ref"] == "app-ci"
    assert (entry["models"], entry["max_in_flight"], entry["rpm"], entry["tpm"]) == (
        ["echo"],
        2,
        30,
        9000,
    )
    assert entry["max_queued"] == 4
    data.update({"model_groups": [], "rpm": "", "max_queued": "99"})
    response = staff.post(change_url(token), data)
    assert response.status_code == 200  # refused whole: max_queued above max_queue
    assert b"openai.principal_tokens[1].max_queued" in response.content
    data["max_queued"] = ""
    assert staff.post(change_url(token), data).status_code == 302
    entry = catalog_to_document()["openai"]["principal_tokens"][1]
    assert "models" not in entry and "rpm" not in entry and "max_queued" not in entry


def test_a_budget_is_edited_in_the_admin_exported_and_checked_r_bud_1(staff, catalog):
    """R-BUD-1: the budget is a column of the token row, in the document, validated whole."""
    token = PrincipalToken.objects.get(token_ref="app-ci")
    data = page_data(staff.get(change_url(token)))
    data.update({"model_groups": [], "budget": '{"tokens": 5000, "period": "week"}'})
    response = staff.post(change_url(token), data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    entry = catalog_to_document()["openai"]["principal_tokens"][1]
    assert entry["budget"] == {"tokens": 5000, "period": "week"}
    data["budget"] = '{"tokens": 0, "period": "week"}'
    response = staff.post(change_url(token), data)
    assert response.status_code == 200  # refused whole, naming the path
    assert b"openai.principal_tokens[1].budget.tokens" in response.content


def test_edge_settings_cannot_be_added_twice_or_deleted(staff, catalog):
    assert staff.get(reverse("admin:catalog_edgesettings_add")).status_code == 403
    settings = EdgeSettings.objects.get()
    url = reverse("admin:catalog_edgesettings_delete", args=[settings.pk])
    assert staff.post(url, {"post": "yes"}).status_code == 403


def test_adding_an_invalid_profile_is_refused_and_nothing_is_created(staff, catalog):
    url = reverse("admin:catalog_protocolprofile_add")
    data = {"name": "broken", "base": "openai", "driver": "telepathy", "settings": "{}"}
    response = staff.post(url, data)
    assert response.status_code == 200
    assert b"protocol_profiles.broken" in response.content
    assert not ProtocolProfile.objects.filter(name="broken").exists()


def test_provider_added_inline_goes_last_in_the_document(staff, catalog):
    node = Node.objects.get(key="node-local")
    data = page_data(staff.get(change_url(node)))
    total = data["providers-TOTAL_FORMS"]
    new = {"key": "echo-2", "legacy_type": "cli", "capacity": "1", "enabled": "on"}
    data.update({f"providers-{total}-{name}": value for name, value in new.items()})
    data[f"providers-{total}-settings"] = '{"command": ["cat"]}'
    data[f"providers-{total}-node"] = node.pk
    data["providers-TOTAL_FORMS"] = total + 1
    assert staff.post(change_url(node), data).status_code == 302
    added = catalog_to_document()["nodes"][0]["providers"][-1]
    assert (added["id"], added["type"], added["command"]) == ("echo-2", "cli", ["cat"])


def test_the_admin_is_branded_with_the_product_name(staff, client):
    """Every admin page and the login say "IOP Edge", never "Django administration"."""
    index = staff.get("/admin/").content.decode()
    assert "<title>Administration | IOP Edge</title>" in index
    assert '<a href="/admin/">IOP Edge</a>' in index and "Django administration" not in index
    client.logout()
    login = client.get("/admin/login/").content.decode()
    assert "IOP Edge" in login and "Django" not in login


def test_principals_are_edited_on_the_edge_settings_page_and_checked_whole(staff, catalog):
    """R-MGD-13: the admin edits ``principals:`` in Edge settings' ``other_sections``; a
    save is kept when the whole catalog loads and refused naming the path when not."""
    settings = EdgeSettings.objects.get()
    data = page_data(staff.get(change_url(settings)))
    data["other_sections"] = '{"principals": [{"id": "team-research", "rpm": 60}]}'
    assert staff.post(change_url(settings), data).status_code == 302
    assert catalog_to_document()["principals"] == [{"id": "team-research", "rpm": 60}]
    data["other_sections"] = '{"principals": [{"id": "team-research", "rpm": 0}]}'
    response = staff.post(change_url(settings), data)
    assert response.status_code == 200
    assert b"principals[0].rpm" in response.content
    assert catalog_to_document()["principals"] == [{"id": "team-research", "rpm": 60}]


def test_the_budget_help_text_says_what_the_load_rule_says(staff, catalog):
    """R-BUD-1: the form tells the operator what the loader enforces: a budget is the
    principal's, stated on one of its tokens (not repeated on each)."""
    token = PrincipalToken.objects.first()
    assert token is not None
    page = staff.get(change_url(token)).content.decode().replace("&#x27;", "'")
    assert "A budget is the principal's: state it on one of its tokens" in page
    assert "the same on every token" not in page
