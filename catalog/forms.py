"""Admin forms: a rejected whole-catalog validation comes back as form errors, one per path."""

from __future__ import annotations

from collections.abc import Sequence

from django import forms
from django.core.exceptions import ValidationError

from catalog.config import ConfigError


def issue_lines(error: ConfigError) -> tuple[str, ...]:
    """Every issue of a rejected load as `path: message` lines."""
    return tuple(str(issue) for issue in error.issues) or (str(error),)


class CatalogForm(forms.ModelForm):
    """A model form that can carry the loader's verdict on the candidate catalog (R-CFG-5)."""

    # Set on a per-request subclass when the candidate catalog was rejected.
    catalog_rejection: Sequence[str] = ()

    def clean(self) -> dict:
        cleaned = super().clean()
        if self.catalog_rejection:
            raise ValidationError(
                [ValidationError(line, code="catalog") for line in self.catalog_rejection]
            )
        return cleaned


def rejecting(form: type[forms.ModelForm], lines: Sequence[str]) -> type[forms.ModelForm]:
    """A subclass of `form` that fails validation with `lines` as non-field errors."""
    if not issubclass(form, CatalogForm):
        raise TypeError(f"{form.__name__} must derive from CatalogForm")
    return type(form.__name__, (form,), {"catalog_rejection": tuple(lines)})


class PrincipalTokenForm(CatalogForm):
    """A token's scope picked from the configured model groups (R-PRIN-1): none = every group."""

    model_groups = forms.MultipleChoiceField(
        label="models",
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Model groups this token may call; none ticked = every group (R-PRIN-1).",
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from catalog.models import ModelGroup

        known = list(ModelGroup.objects.values_list("key", flat=True))
        current = [m for m in (self.initial.get("model_groups") or []) if m not in known]
        field = self.fields["model_groups"]
        assert isinstance(field, forms.MultipleChoiceField)
        field.choices = [(key, key) for key in [*known, *current]]

    def clean_model_groups(self) -> list[str] | None:
        chosen = self.cleaned_data.get("model_groups") or []
        return list(chosen) or None
