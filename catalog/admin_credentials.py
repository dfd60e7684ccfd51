"""Admin pages for managed credentials (R-MGD-2, R-MGD-3): slots are write-only, routes show
their bindings and never a key. docs/credentials.md."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest
from django.utils.decorators import method_decorator
from django.views.decorators.debug import sensitive_post_parameters

from catalog.keyring import Keyring
from catalog.models import CredentialSlot, Route, RouteSlot
from catalog.slots import (
    MAX_SECRET_BYTES,
    CredentialError,
    catalog_snapshot,
    check_slot,
    keyring_path,
    load_keyring,
    set_slot,
)


class SlotForm(forms.ModelForm):
    """The secret is a password field that is never rendered back (R-MGD-2). Every value is
    checked here, with ``iop_slot set``'s own rules, so a save never fails after the form:
    a bad id, profile or secret is a form error, never a 500."""

    secret = forms.CharField(
        widget=forms.PasswordInput(render_value=False),
        required=False,
        strip=False,  # check_slot drops surrounding whitespace, as iop_slot set does
        help_text="Write-only: never shown again. Leave empty to keep the current secret. "
        f"At most {MAX_SECRET_BYTES} bytes of UTF-8 text.",
    )

    class Meta:
        model = CredentialSlot
        fields = ("key", "profile")

    def clean(self) -> dict:
        cleaned = super().clean()
        if self.errors:  # the id or the profile already failed their field checks
            return cleaned
        secret = cleaned.get("secret", "")
        if not self.instance.pk and not secret:
            raise forms.ValidationError("a new slot needs its secret")
        if secret:
            slot_id = cleaned.get("key") or self.instance.key
            profile = cleaned.get("profile") or self.instance.profile
            try:
                snapshot = catalog_snapshot()
                # Bounded before encoding: 4 bytes per character at most in UTF-8.
                raw = secret[: MAX_SECRET_BYTES + 1].encode("utf-8", "surrogatepass")
                check_slot(slot_id, profile, raw, snapshot)
                self.keyring: Keyring = load_keyring(keyring_path(snapshot, None))
            except CredentialError as exc:
                raise forms.ValidationError(str(exc)) from None
        return cleaned


@admin.register(CredentialSlot)
class CredentialSlotAdmin(admin.ModelAdmin):
    form = SlotForm
    list_display = ("key", "profile", "credential_revision", "updated_at")
    search_fields = ("key", "profile")

    @method_decorator(sensitive_post_parameters("secret"))  # never on a DEBUG error page
    def changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        return super().changeform_view(request, *args, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj=None) -> tuple[str, ...]:
        # R-MGD-6: a slot keeps its profile; its id is bound into the sealed value.
        if obj is not None:
            return ("key", "profile", "credential_revision")
        return ("credential_revision",)

    def save_model(self, request: HttpRequest, obj: CredentialSlot, form, change: bool) -> None:
        secret = form.cleaned_data.get("secret", "")
        if secret:
            saved = set_slot(obj.key, obj.profile, secret.encode(), form.keyring)
            obj.pk, obj.credential_revision = saved.pk, saved.credential_revision
        else:
            obj.save()


class RouteSlotInline(admin.TabularInline):
    model = RouteSlot
    extra = 0
    can_delete = False
    readonly_fields = ("target", "slot")

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False  # bindings are checked against the catalog by `iop_route create`


@admin.register(Route)
class RouteAdmin(admin.ModelAdmin):
    """Routes are created by `iop_route create` (the key is printed once); here they are
    listed, enabled or disabled, relabelled and deleted."""

    list_display = ("key", "model_group", "principal_ref", "enabled", "revision", "bindings")
    list_filter = ("enabled", "model_group")
    search_fields = ("key", "model_group", "principal_ref")
    fields = ("key", "model_group", "principal_ref", "enabled", "revision", "key_prefix")
    readonly_fields = ("key", "model_group", "revision", "key_prefix")
    inlines = (RouteSlotInline,)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description="key sha256")
    def key_prefix(self, obj: Route) -> str:
        return f"{obj.key_hash_sha256[:12]}…"

    @admin.display(description="slots")
    def bindings(self, obj: Route) -> str:
        return ", ".join(str(binding) for binding in obj.slots.select_related("slot"))

    def save_model(self, request: HttpRequest, obj: Route, form, change: bool) -> None:
        if change:
            obj.revision += 1  # the route revision each envelope is bound to (R-AUTH-5)
        obj.save()
