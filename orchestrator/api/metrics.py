"""``/api/metrics/``: the Prometheus text of ``/metrics`` for a signed-in user or an API token, of
what that user may read (``orchestrator.metrics.text_for``)."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from orchestrator import metrics
from orchestrator.api.base import APIBase, errors
from orchestrator.api.schema import extend_schema


class MetricsView(APIBase):
    @extend_schema(tags=["metrics"], summary="Metrics in Prometheus' text format, of what the caller may read",
                   description="A global viewer gets what /metrics reports; a user with rights on some tenants "
                               "gets their workflows' labels and their task runs' counts only.",
                   responses={(200, "text/plain"): OpenApiResponse(OpenApiTypes.STR), **errors(401, 403)})
    def get(self, request):
        return HttpResponse(metrics.text_for(request.user), content_type=CONTENT_TYPE_LATEST)
