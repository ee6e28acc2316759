"""The app's URLs, for a project to mount under any prefix:

    path("orchestrator/", include("orchestrator.urls")),

Every URL is reversed by name (``orchestrator:web:run``, ``orchestrator:api:run``,
``orchestrator:metrics``), so links, redirects, htmx requests and the API's Location headers
follow the prefix."""

from django.urls import include, path

app_name = "orchestrator"

urlpatterns = [
    path("api/", include("orchestrator.api.urls")),
    path("", include("orchestrator.ops_urls")),
    path("", include("orchestrator.web.urls")),
]
