from django.contrib import admin
from django.urls import include, path
from shop import views

urlpatterns = [
    path("", views.home),
    path("admin/", admin.site.urls),
    # --- README: Add it to an existing Django project (urls.py)
    path("ops/orchestrator/", include("orchestrator.urls")),
    # --- end
]
