"""The standalone project's URLs: the admin, and the app at the root."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("orchestrator.urls")),
]

# A bug answers JSON under the app's API and a plain page elsewhere, never the server's internals.
handler500 = "orchestrator.web.errors.server_error"
