"""REST API for config revisions: list, create, retrieve, diff, dry-run, apply, stage.

Staff with the same model permissions as the admin (``refresh.permissions``).

Each action parses its input, calls one function of ``refresh.services`` and renders the
report with the status the service chose (400 invalid, 409 refused, 503 no running Edge).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from refresh import services
from refresh.models import ConfigRevision
from refresh.permissions import RevisionPermission
from refresh.report import diff_report, error_report
from refresh.serializers import (
    ReportSerializer,
    RevisionCreateSerializer,
    RevisionDetailSerializer,
    RevisionSerializer,
)

REFUSALS = {
    400: OpenApiResponse(ReportSerializer, description="invalid: errors name their paths"),
    409: OpenApiResponse(ReportSerializer, description="refused: restart-required or stale"),
}


def render(outcome: services.Outcome) -> Response:
    """The report, with the status the service chose."""
    return Response(outcome.body, status=outcome.status)


def invalid(mode: str, errors: Mapping[str, Any]) -> Response:
    """A malformed request as a 400 report (the shape the schema documents), each error by
    the field it is about (``<root>`` for the request as a whole)."""
    issues = [
        ("<root>" if field == "non_field_errors" else field, str(message))
        for field, messages in errors.items()
        for message in (messages if isinstance(messages, list) else [messages])
    ]
    return Response(error_report(mode, "invalid", issues).as_dict(), status=400)


class RevisionViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Config revisions; the newest first."""

    queryset = ConfigRevision.objects.select_related("parent")
    permission_classes = [RevisionPermission]

    def get_serializer_class(self) -> type:
        return RevisionSerializer if self.action == "list" else RevisionDetailSerializer

    @extend_schema(
        request=RevisionCreateSerializer,
        responses={201: RevisionDetailSerializer, **REFUSALS},
        summary="Create a draft revision from a document or from the catalog",
    )
    def create(self, request: Request) -> Response:
        form = RevisionCreateSerializer(data=request.data)
        if not form.is_valid():
            return invalid(services.CREATE, form.errors)
        if form.validated_data["from_catalog"]:
            outcome = services.create_from_catalog(request.user)
        else:
            outcome = services.create_revision(
                form.validated_data["document"],
                source=ConfigRevision.Source.DOCUMENT,
                author=request.user,
            )
        if outcome.revision is None:
            return render(outcome)
        return Response(
            RevisionDetailSerializer(outcome.revision).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(
        request=None,
        responses={201: RevisionDetailSerializer, 400: REFUSALS[400]},
        summary="Create a draft revision from the catalog tables as they are now",
    )
    @action(detail=False, methods=["post"], url_path="from-catalog")
    def from_catalog(self, request: Request) -> Response:
        outcome = services.create_from_catalog(request.user)
        if outcome.revision is None:
            return render(outcome)
        return Response(
            RevisionDetailSerializer(outcome.revision).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "against", str, description='"parent" (default), "active", or a revision id'
            )
        ],
        responses={200: ReportSerializer, 400: REFUSALS[400]},
        summary="The changed paths between this revision and another one, classified",
    )
    @action(detail=True, methods=["get"])
    def diff(self, request: Request, pk: Any = None) -> Response:
        revision = self.get_object()
        against = request.query_params.get("against", "parent")
        if against == "parent":
            base = revision.parent
        elif against == "active":
            base = services.active_revision()
        elif against.isdigit():
            base = get_object_or_404(ConfigRevision, pk=int(against))
        else:
            return invalid(services.DIFF, {"against": ['"parent", "active" or a revision id']})
        report = diff_report(
            base.document if base else None,
            revision.document,
            mode=services.DIFF,
            outcome=services.DIFF,
        )
        report = report.but(revision=revision.pk, parent=base.pk if base else None)
        return Response(report.as_dict())

    @extend_schema(
        request=None,
        responses={200: ReportSerializer, **REFUSALS},
        summary="Validate and classify against what runs; changes nothing",
    )
    @action(detail=True, methods=["post"], url_path="dry-run")
    def dry_run(self, request: Request, pk: Any = None) -> Response:
        revision = self.get_object()
        edge = services.running_edge()
        return render(services.dry_run(revision.document, edge, revision=revision))

    @extend_schema(
        request=None,
        responses={
            200: ReportSerializer,
            **REFUSALS,
            500: OpenApiResponse(
                ReportSerializer,
                description="committed, but the running Edge could not install it: it keeps "
                "the previous revision, and this one is marked failed",
            ),
            503: OpenApiResponse(ReportSerializer, description="no running Edge here"),
        },
        summary="Apply live, or refuse whole when any path is restart-required",
    )
    @action(detail=True, methods=["post"])
    def apply(self, request: Request, pk: Any = None) -> Response:
        edge = services.running_edge()
        return render(services.apply_revision(edge, self.get_object(), actor=request.user))

    @extend_schema(
        request=None,
        responses={200: ReportSerializer, **REFUSALS},
        summary="Make this revision active at the next start",
    )
    @action(detail=True, methods=["post"])
    def stage(self, request: Request, pk: Any = None) -> Response:
        outcome = services.stage_revision(self.get_object(), actor=request.user)
        return render(outcome)
