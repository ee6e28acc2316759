"""Operational endpoints. ProbeMiddleware answers the same paths first (before host validation
and the HTTPS redirect); these routes name them and serve them if the middleware is left out."""

from django.urls import path

from orchestrator import health, metrics

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics_view, name="metrics"),
]
