from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("orchestrator.api.urls")),
    path("", include("orchestrator.ops_urls")),
    path("", include("orchestrator.web.urls")),
]
