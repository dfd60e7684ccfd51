"""Admin pages for managed credentials (R-MGD-2, R-MGD-3): slots are write-only; a route is
created or its key rotated here like `iop_route create` / `rotate`: the key is shown once, on
the answer to that POST, and only its sha256 is stored. docs/credentials.md."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.decorators import method_decorator
from django.views.decorators.debug import sensitive_post_parameters

from catalog.keyring import Keyring
from catalog.models import CredentialSlot, Route, RouteSlot
from catalog.slots import (
    MAX_SECRET_BYTES,
    CredentialError,
    catalog_snapshot,
    check_bindings,
    check_id,
    check_slot,
    create_route,
    keyring_path,
    load_keyring,
    managed_mode_off,
    parse_bindings,
    rotate_route_key,
    set_slot,
)


def _managed_off(request: HttpRequest) -> str | None:
    """``managed_mode_off()``, worked out once per request."""
    if not hasattr(request, "iop_managed_off"):
        request.iop_managed_off = managed_mode_off()  # type: ignore[attr-defined]
    return request.iop_managed_off  # type: ignore[attr-defined]


class ManagedOnly(admin.ModelAdmin):
    """Routes and slots are used only in managed mode (docs/credentials.md). Outside it the
    index does not list them, nothing can be added, and their pages, reached by address,
    say that managed mode is off instead of offering a form that cannot work."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return _managed_off(request) is None and super().has_module_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return _managed_off(request) is None and super().has_add_permission(request)

    def _say_off(self, request: HttpRequest) -> None:
        off = _managed_off(request)
        if off is not None:
            name = self.model._meta.verbose_name_plural
            messages.warning(request, f"{off[0].upper()}{off[1:]}. {name.capitalize()} are "
                             "used only in managed mode.")  # fmt: skip

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        self._say_off(request)
        return super().changelist_view(request, extra_context)

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: Any = None):
        if _managed_off(request) is not None:  # a bookmarked "add" page: say why, list them
            self._say_off(request)
            opts = self.model._meta
            return HttpResponseRedirect(
                reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
            )
        return super().add_view(request, form_url, extra_context)

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: Any = None) -> Any:  # fmt: skip
        if request.method == "GET":
            self._say_off(request)
        return super().change_view(request, object_id, form_url, extra_context)


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
class CredentialSlotAdmin(ManagedOnly):
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


class RouteCreateForm(forms.ModelForm):
    """A new route: its model group and slots, checked against the catalog (R-MGD-3, 6)."""

    model_group = forms.ChoiceField(help_text="The one model group this route's key may call.")
    slots = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="One PROVIDER_OR_PROFILE=SLOT a line: the slot for a provider id of the "
        "group, or for every provider of a profile.",
    )

    class Meta:
        model = Route
        fields = ("key", "model_group", "principal_ref")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        try:
            self.snapshot = catalog_snapshot()
            groups = sorted(self.snapshot.models)
        except CredentialError as exc:
            self.snapshot, groups = None, []
            self.catalog_error = str(exc)
        field = self.fields["model_group"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [(g, g) for g in groups]

    def clean(self) -> dict:
        cleaned = super().clean()
        if self.snapshot is None:
            raise forms.ValidationError(self.catalog_error)
        try:
            check_id("route", cleaned.get("key", ""))
            if cleaned.get("principal_ref"):
                check_id("principal", cleaned["principal_ref"])
            cleaned["bindings"] = parse_bindings(cleaned.get("slots", "").split())
            check_bindings(self.snapshot, cleaned.get("model_group", ""), cleaned["bindings"])
        except CredentialError as exc:
            raise forms.ValidationError(str(exc)) from None
        return cleaned


@admin.register(Route)
class RouteAdmin(ManagedOnly):
    """Routes: created here or by `iop_route create`, the key shown once; listed, enabled or
    disabled, relabelled, their key rotated, deleted."""

    list_display = ("key", "model_group", "principal", "enabled", "revision", "bindings")
    list_filter = ("enabled", "model_group")
    search_fields = ("key", "model_group", "principal_ref")
    fields = ("key", "model_group", "principal_ref", "enabled", "revision", "key_prefix")
    readonly_fields = ("key", "model_group", "revision", "key_prefix")
    inlines = (RouteSlotInline,)

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any):
        if obj is None:
            kwargs["form"] = RouteCreateForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ("key", "model_group", "slots", "principal_ref")
        return self.fields

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return () if obj is None else self.readonly_fields

    def get_inlines(self, request: HttpRequest, obj: Any) -> Any:
        return () if obj is None else self.inlines

    @admin.display(description="principal", ordering="principal_ref")
    def principal(self, obj: Route) -> str:
        """The principal its usage counts for: its own, else the route id (docs/credentials.md)."""
        return obj.principal_ref or f"{obj.key} (the route id)"

    @admin.display(description="key sha256")
    def key_prefix(self, obj: Route) -> str:
        return f"{obj.key_hash_sha256[:12]}…"

    @admin.display(description="slots")
    def bindings(self, obj: Route) -> str:
        return ", ".join(str(binding) for binding in obj.slots.select_related("slot"))

    def save_model(self, request: HttpRequest, obj: Route, form, change: bool) -> None:
        if not change:
            data = form.cleaned_data
            key = create_route(
                obj.key, data["model_group"], data["bindings"], principal_ref=obj.principal_ref
            )
            saved = Route.objects.get(key=obj.key)
            obj.pk, obj.key_hash_sha256, obj.revision = saved.pk, saved.key_hash_sha256, 1
            obj.minted_key = key  # type: ignore[attr-defined]  # shown once by response_add
            return
        obj.revision += 1  # the route revision each envelope is bound to (R-AUTH-5)
        obj.save()

    def save_related(self, request: HttpRequest, form, formsets, change: bool) -> None:
        if change:  # a new route's slots were written by create_route
            super().save_related(request, form, formsets, change)

    def response_add(self, request: HttpRequest, obj: Route, post_url_continue=None):
        return self.key_page(request, obj, obj.minted_key, "created")  # type: ignore[attr-defined]

    def get_urls(self) -> list:
        wrap = self.admin_site.admin_view
        own = [
            path(
                "<path:object_id>/rotate-key/",
                wrap(self.rotate_key_view),
                name="catalog_route_rotate_key",
            )
        ]
        return own + super().get_urls()

    def rotate_key_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET (or a POST without ``confirm``) asks first: the caller's key stops working."""
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        route = get_object_or_404(Route, pk=object_id)
        if not self.has_change_permission(request, route):
            raise PermissionDenied
        if request.method == "GET" or request.POST.get("confirm") != "yes":
            context = {
                **self.admin_site.each_context(request),
                "title": f"Rotate the key of route {route.key}?",
                "opts": self.model._meta,
                "route": route,
            }
            return TemplateResponse(
                request, "admin/catalog/route/rotate_confirmation.html", context
            )
        key = rotate_route_key(route.key)
        route.refresh_from_db()
        self.log_change(request, route, "Rotated the route key.")
        return self.key_page(request, route, key, "rotated")

    def key_page(self, request: HttpRequest, route: Route, key: str, done: str) -> HttpResponse:
        """The one answer that carries the raw key; never cached, never shown again."""
        context = {
            **self.admin_site.each_context(request),
            "title": f"Route {route.key}: key {done}",
            "opts": self.model._meta,
            "route": route,
            "route_key": key,
            "done": done,
        }
        response = TemplateResponse(request, "admin/catalog/route/route_key.html", context)
        response["Cache-Control"] = "no-store"
        return response
