"""REST API routes under /api/: config revisions and the OpenAPI schema."""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.routers import DefaultRouter

from refresh.api import RevisionViewSet

router = DefaultRouter()
router.register("revisions", RevisionViewSet, basename="revision")

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("", include(router.urls)),
]
