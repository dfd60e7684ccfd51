from django.contrib import admin
from django.urls import include, path

from pool import status, usage_page

# The admin names the product, not the framework (docs/admin.md).
admin.site.site_header = "IOP Edge"
admin.site.site_title = "IOP Edge"
admin.site.index_title = "Administration"

urlpatterns = [
    path("api/pool/", status.PoolSnapshotView.as_view(), name="api-pool"),
    path("admin/pool-status/", status.status_page, name="pool-status"),
    path("admin/pool-status/status.json", status.status_json, name="pool-status-json"),
    path("admin/usage/", usage_page.usage_page, name="usage-chart"),
    path("admin/", admin.site.urls),
    path("api/", include("refresh.urls")),
]
