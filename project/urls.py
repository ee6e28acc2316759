"""The standalone project's URLs: the admin, the app at the root, and /favicon.ico (which browsers
ask for on every page, the admin's included) sent to the app's icon."""

from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView


class Favicon(RedirectView):
    permanent = False  # the static name changes with the file (hashed names with DEBUG off)

    def get_redirect_url(self, *args, **kwargs):
        return static("orchestrator/favicon.svg")


urlpatterns = [
    path("favicon.ico", Favicon.as_view(), name="favicon"),
    path("admin/", admin.site.urls),
    path("", include("orchestrator.urls")),
]

# A bug answers JSON under the app's API and a plain page elsewhere, never the server's internals.
handler500 = "orchestrator.web.errors.server_error"
