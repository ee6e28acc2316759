"""Recording a dataset event by hand through the API (operators): ``POST api/dataset-events/``
with the dataset's name and optional metadata, as the dataset page's form does; audited. The
list of events (GET) is ``views.DatasetEventListView``."""

from __future__ import annotations

from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.response import Response

from orchestrator import access, audit, clock, datasets, limits
from orchestrator.api import serializers as s
from orchestrator.api.base import body, errors, validated
from orchestrator.api.schema import extend_schema
from orchestrator.api.views import DatasetEventListView
from orchestrator.models import Dataset, DatasetEvent
from orchestrator.web.lineage import declared


class DatasetEventRecordSerializer(serializers.Serializer):
    dataset = serializers.CharField(max_length=200, trim_whitespace=False,
                                    help_text="the dataset's name (one a workflow declares, or with events)")
    metadata = serializers.JSONField(required=False, default=dict,
                                     help_text="a JSON object the consumers read in ctx.events")

    def validate_dataset(self, value):
        if "\x00" in value:
            raise serializers.ValidationError("contains a NUL character")
        return value

    def validate_metadata(self, value):
        if not isinstance(value, dict):
            raise serializers.ValidationError(f"must be a JSON object, got a {type(value).__name__}")
        problem = limits.json_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value


class DatasetEventsView(DatasetEventListView):
    @extend_schema(tags=["datasets"], operation_id="dataset_events_create",
                   summary="Record a dataset event by hand (operators; audited)",
                   description="For data that arrived outside the orchestrator: the event starts the "
                               "dataset's consumer workflows as a producer's event would. An unknown dataset "
                               "is a 404.",
                   request=DatasetEventRecordSerializer,
                   responses={201: s.DatasetEventSerializer, **errors(400, 401, 403, 404)})
    def post(self, request):
        # The event starts the dataset's consumers of every tenant: a global operator's to record.
        if not access.is_operator(request.user):
            raise PermissionDenied("recording a dataset event needs the Operators group: it starts the consumers of "
                                   "every tenant")
        data = validated(DatasetEventRecordSerializer, body(request))
        name = data["dataset"]
        if name not in declared() and not Dataset.objects.filter(name=name).exists():
            raise NotFound({"detail": f"unknown dataset {name!r}", "dataset": [f"unknown dataset {name!r}"]})
        event = datasets.record_by_hand(name, data["metadata"], now=clock.now())
        audit.record("dataset_event", request=request, target=event, target_type="dataset_event", dataset=name,
                     metadata=data["metadata"])
        event = DatasetEvent.objects.select_related("dataset").prefetch_related("consumers__workflow").get(pk=event.pk)
        return Response(s.DatasetEventSerializer(event).data, status=status.HTTP_201_CREATED)
