"""What every view of the API shares: its base class (authentication, permissions, JSON only,
schema, error handling, keyset pages), the error responses and page shapes of the schema, the
request body, the idempotency key, and the lookups of the objects named in a path."""

from __future__ import annotations

import re
from functools import cache

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.views import APIView

from orchestrator import access, reads
from orchestrator.api import serializers as s
from orchestrator.api.errors import exception_handler
from orchestrator.api.parsing import JSONParser, KeysetPagination
from orchestrator.api.permissions import TokenAuthentication, ViewerReadsOperatorWrites
from orchestrator.api.schema import Schema
from orchestrator.models import Run, Workflow

IDEMPOTENCY_KEY_PATTERN = r"^[!-~]([ -~]{0,253}[!-~])?$"  # 1 to 255 printable ASCII characters, no edge spaces
IDEMPOTENCY_HEADER = OpenApiParameter(
    "Idempotency-Key", {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN, "maxLength": 255},
    OpenApiParameter.HEADER, required=False,
    description="Same as the idempotency_key field; retries with one key create one resource. Give the key "
                "one way or the other: a header and a field that differ are a 400.",
)
# The 400 of an operation that takes an idempotency key, which a schema cannot state as a rule
# (the header and the body are checked apart).
IDEMPOTENCY_400 = ("invalid input: each bad field has a list of messages; also when the Idempotency-Key "
                   "header and the idempotency_key field differ")


def errors(*codes: int, bad_input: str | None = None) -> dict:
    """The error responses of an operation for the schema; ``bad_input`` describes its 400 when it
    has a reason of its own."""
    described = {
        400: "invalid input: each bad field has a list of messages",
        401: "no credentials (a token or a session)",
        403: "the user lacks the Viewers/Operators group or the tenant right this needs",
        404: "no such object",
        409: "the idempotency key was used for a different request",
        502: "the value is kept in the log storage, which has no file for it (deleted by hand): the "
             "detail names the file",
        503: "the value is kept in the log storage, which did not answer: the detail says why; try again",
    }
    if bad_input:
        described[400] = bad_input
    return {code: OpenApiResponse(s.ErrorSerializer, description=described[code]) for code in codes}


@cache
def paginated_schema(item_serializer):
    """The shape of a cursor page, for the schema."""
    name = f"Paginated{item_serializer.__name__.removesuffix('Serializer')}List"
    return type(name, (serializers.Serializer,), {
        "next": serializers.URLField(allow_null=True),
        "previous": serializers.URLField(allow_null=True),
        "results": item_serializer(many=True),
    })


def filter_workflow(name: str, user) -> int:
    """The id of the workflow a list is filtered by: like a workflow in the path, an unknown one
    (or one ``user`` may not read) is a 404."""
    workflow_id = reads.workflow_id(name)
    if workflow_id is not None and not access.visible(user, Workflow.objects.filter(pk=workflow_id)).exists():
        workflow_id = None
    if workflow_id is None:
        raise NotFound({"detail": f"unknown workflow {name!r}", "workflow": [f"unknown workflow {name!r}"]})
    return workflow_id


def get_workflow(name: str, user) -> Workflow:
    """The workflow named ``name`` that ``user`` may read, or a 404."""
    # PostgreSQL text cannot hold NUL, so no workflow has such a name (and asking would be a DataError).
    workflow = None if "\x00" in name else access.visible(
        user, Workflow.objects.select_related("current_version")).filter(name=name).first()
    if workflow is None:
        raise NotFound(f"unknown workflow {name!r}")
    return workflow


def get_run(pk: int, user, **filters) -> Run:
    """The run ``pk`` that ``user`` may read, or a 404."""
    # Not the graph (a workflow of 100,000 tasks has megabytes of it): a run is shown without.
    run = (access.visible(user, Run.objects.select_related("workflow", "version", "schedule", "created_by"))
           .defer("version__spec").filter(pk=pk, **filters).first())
    if run is None:
        raise NotFound(f"no run {pk}" if not filters else f"no job {pk}")
    return run


def validated(serializer_class, data, **kwargs):
    serializer = serializer_class(data=data, **kwargs)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def idempotency_key(request, data: dict) -> str | None:
    """The key from the Idempotency-Key header or the body's field; both must agree."""
    header = request.headers.get("Idempotency-Key")
    body = data.get("idempotency_key")
    if header is not None:
        if not re.fullmatch(IDEMPOTENCY_KEY_PATTERN, header):
            raise ValidationError({"idempotency_key": ["the Idempotency-Key header must be 1 to 255 printable "
                                                       "ASCII characters, without spaces at either end"]})
        if body and body != header:
            raise ValidationError({"idempotency_key": ["the Idempotency-Key header and the idempotency_key "
                                                       "field differ; send one of them"]})
        return header
    return body or None


def body(request) -> dict:
    """The request body as an object; a JSON array or scalar is a 400, not a crash."""
    data = request.data
    if not hasattr(data, "get"):
        raise ValidationError({"non_field_errors": [f"expected a JSON object, got {type(data).__name__}"]})
    return data


class BrowsableAPI(BrowsableAPIRenderer):
    """DRF's browsable API without the inline <style> of its code highlighting, which the
    Content-Security-Policy refuses (this API's docstrings hold no code to highlight)."""

    def get_context(self, *args, **kwargs):
        context = super().get_context(*args, **kwargs)
        context["code_style"] = None
        return context


class APIBase(APIView):
    """Every view of the API. Its authentication, permissions, parsers, renderers, schema and error
    handling are set here, so the project's REST_FRAMEWORK defaults (made for its own API) change
    nothing in this one."""

    authentication_classes = [TokenAuthentication, SessionAuthentication]
    permission_classes = [ViewerReadsOperatorWrites]
    parser_classes = [JSONParser]  # the API speaks JSON only; forms belong to the web UI
    renderer_classes = [JSONRenderer, BrowsableAPI]
    schema = Schema()
    versioning_class = None

    def get_exception_handler(self):
        return exception_handler

    def page(self, queryset, serializer_class, pagination_class=KeysetPagination, context=None):
        paginator = pagination_class()
        items = paginator.paginate_queryset(queryset, self.request, view=self)
        data = serializer_class(items, many=True, context=context or {}).data
        return paginator.get_paginated_response(data)
