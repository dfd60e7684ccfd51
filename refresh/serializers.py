"""REST shapes for config revisions and refresh reports."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from refresh.models import ConfigRevision


class RevisionSerializer(serializers.ModelSerializer):
    """A revision in lists: lineage, who, when, state and the stored report."""

    class Meta:
        model = ConfigRevision
        fields = [*ConfigRevision.RECORD_FIELDS, "report"]
        read_only_fields = fields


class RevisionDetailSerializer(RevisionSerializer):
    """A single revision, with its whole document."""

    class Meta(RevisionSerializer.Meta):
        fields = [*RevisionSerializer.Meta.fields, "document"]
        read_only_fields = fields


class RevisionCreateSerializer(serializers.Serializer):
    """Either a whole config document or ``from_catalog: true``."""

    document = serializers.JSONField(required=False, help_text="A whole config document.")
    from_catalog = serializers.BooleanField(
        required=False, default=False, help_text="Build the document from the catalog tables."
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        has_document = attrs.get("document") is not None
        if has_document == bool(attrs.get("from_catalog")):
            raise serializers.ValidationError("give exactly one of document or from_catalog")
        if has_document and not isinstance(attrs["document"], dict):
            raise serializers.ValidationError({"document": "must be a JSON object"})
        return attrs


class ChangeSerializer(serializers.Serializer):
    """One changed path, its kind, its class (R-REF-2), why, and its old and new values
    unless the path is secret (R-REF-6, docs/refresh.md "The report")."""

    path = serializers.CharField()
    kind = serializers.ChoiceField(choices=["added", "removed", "changed"])
    reason = serializers.CharField()
    secret = serializers.BooleanField(help_text="True: a secret path; no value is given.")
    old = serializers.JSONField(required=False, help_text="Before; absent when added.")
    new = serializers.JSONField(required=False, help_text="After; absent when removed.")

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["class"] = serializers.ChoiceField(choices=["live", "restart_required"])
        return fields


class IssueSerializer(serializers.Serializer):
    path = serializers.CharField()
    message = serializers.CharField()


class ReportSerializer(serializers.Serializer):
    """The refresh report (R-REF-4): every list is present and sorted, never null."""

    mode = serializers.CharField()
    outcome = serializers.CharField()
    valid = serializers.BooleanField()
    changed = serializers.BooleanField()
    changed_nodes = serializers.ListField(child=serializers.CharField())
    changed_providers = serializers.ListField(child=serializers.CharField())
    changed_models = serializers.ListField(child=serializers.CharField())
    live_paths = serializers.ListField(child=serializers.CharField())
    restart_required_paths = serializers.ListField(child=serializers.CharField())
    changes = ChangeSerializer(many=True)
    applied = serializers.BooleanField()
    pushed_nodes = serializers.ListField(child=serializers.CharField())
    errors = IssueSerializer(many=True)
    revision = serializers.IntegerField(allow_null=True)
    parent = serializers.IntegerField(allow_null=True)
    active = serializers.IntegerField(allow_null=True)
