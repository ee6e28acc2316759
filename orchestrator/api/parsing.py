"""What the API reads from a request besides its serializers: the JSON body, the query parameters of
its lists, and the cursor and page size of their pages.

Every rule here is also written into the OpenAPI schema (the patterns and ranges of the parameters
below), so a client can tell a good request from a bad one without sending it; the fuzz test
(tests/processes/test_api_fuzz.py) checks that the server and the schema agree.

Pages are the keyset pages of ``reads.Keyset``, newest first, as the web pages' are. A cursor
names the row a page starts after: ``older.<id>`` lists the rows older than run (or job,
backfill) ``<id>``, ``newer.<id>`` the rows newer than it; the dead-letter queue, ordered by when
each task run died, uses ``older.<microseconds since 1970>.<id>``. Every string of that form is a
valid cursor, even one that points past the end (its page is empty), and page 10,000 costs what
page 1 does.
"""

from __future__ import annotations

import re

from drf_spectacular.utils import OpenApiParameter
from rest_framework import parsers
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.pagination import BasePagination
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from orchestrator import reads
from orchestrator.limits import MAX_JSON_DEPTH, MAX_PAGE_SIZE, PAGE_SIZE


class JSONParser(parsers.JSONParser):
    """DRF's parser, plus an answer for JSON nested so deep that Python's decoder gives up (a
    RecursionError, which would otherwise be a server error)."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested far deeper than the {MAX_JSON_DEPTH} levels allowed") from None


def shown(text: str) -> str:
    """A query value quoted for a message, cut short."""
    return repr(text) if len(text) <= 80 else f"{text[:80]!r}... ({len(text):,} characters)"


def validated_query(serializer_class, query) -> dict:
    """The query parameters a filter serializer declares, checked. An empty value is refused rather
    than read as "any": the schema says each filter is at least one character, and a client that
    sends ``?workflow=`` meant something."""
    fields = serializer_class().fields
    empty = {name: ["must not be empty; leave the parameter out to match any"]
             for name in fields if name in query and query.get(name) == ""}
    if empty:
        raise ValidationError(empty)
    serializer = serializer_class(data=query)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


# --- pages ---------------------------------------------------------------------------------------

LIMIT = OpenApiParameter(
    "limit", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_SIZE},
    description=f"page size, 1 to {MAX_PAGE_SIZE} (default {PAGE_SIZE})",
)
ID_CURSOR_PATTERN = reads.BY_ID.pattern
TIME_CURSOR_PATTERN = reads.DEAD_LETTER_ORDER.pattern
CURSOR = OpenApiParameter(
    "cursor", {"type": "string", "pattern": ID_CURSOR_PATTERN},
    description="From a page's next or previous link: `older.<id>` (the rows after that one, newest "
                "first) or `newer.<id>` (the rows before it).",
)
TIME_CURSOR = OpenApiParameter(
    "cursor", {"type": "string", "pattern": TIME_CURSOR_PATTERN},
    description="From a page's next or previous link: `older.<microseconds since 1970>.<id>` or "
                "`newer.<microseconds>.<id>`, the position of a row in the list.",
)


def page_size(request) -> int:
    text = request.query_params.get("limit")
    if text is None:
        return PAGE_SIZE
    if not re.fullmatch(r"[0-9]{1,6}", text) or not 1 <= int(text) <= MAX_PAGE_SIZE:
        raise ValidationError({"limit": [f"must be a whole number from 1 to {MAX_PAGE_SIZE}, got {shown(text)}"]})
    return int(text)


class KeysetPagination(BasePagination):
    """A page of ``reads.Keyset``: newest first by id; subclasses name another order."""

    keyset = reads.BY_ID

    def _cursor(self, request) -> reads.Cursor | None:
        text = request.query_params.get("cursor")
        if text is None:
            return None
        cursor = self.keyset.parse(text)
        if cursor is None:
            raise ValidationError({"cursor": [f"expected a cursor like {self.keyset.example!r} (from a page's next "
                                              f"or previous link), got {shown(text)}"]})
        return cursor

    def paginate_queryset(self, queryset, request, view=None):
        self.request = request
        size = page_size(request)
        self.keyset_page = self.keyset.page(queryset, self._cursor(request), size)
        return self.keyset_page.rows

    def _link(self, cursor: reads.Cursor | None) -> str | None:
        if cursor is None:
            return None
        return replace_query_param(self.request.build_absolute_uri(), "cursor", self.keyset.text(cursor))

    def get_paginated_response(self, data):
        return Response({"next": self._link(self.keyset_page.older), "previous": self._link(self.keyset_page.newer),
                         "results": data})


RUN_TASK_RUN_CURSOR_PATTERN = r"^after\.[0-9]{1,18}$"
RUN_TASK_RUN_CURSOR = OpenApiParameter(
    "cursor", {"type": "string", "pattern": RUN_TASK_RUN_CURSOR_PATTERN},
    description="From a page's next link: `after.<task run id>`, the task runs after that one by task and "
                "map index (a cursor of another run's task run gives an empty page).",
)


class RunTaskRunPagination(BasePagination):
    """A run's task runs by task name and map index, forward only (``reads.run_task_runs``): a page
    is one indexed query of at most ``limit + 1`` rows, page 2,000 of a map over 100,000 items
    included, plus the lookup of the cursor's task run."""

    def __init__(self, run_id: int, task: str | None, state: str | None):
        self.run_id, self.task, self.state = run_id, task, state

    def paginate_queryset(self, queryset, request, view=None):
        self.request = request
        size = page_size(request)
        after = None
        text = request.query_params.get("cursor")
        if text is not None:
            if not re.fullmatch(RUN_TASK_RUN_CURSOR_PATTERN, text):
                raise ValidationError({"cursor": [f"expected a cursor like 'after.42' (from a page's next link), "
                                                  f"got {shown(text)}"]})
            after = queryset.filter(pk=int(text.split(".")[1])).values_list("task", "map_index").first()
            if after is None:
                self.rows, self.more = [], False
                return self.rows
        self.rows, self.more = reads.run_task_runs(self.run_id, task=self.task, state=self.state, after=after,
                                                   size=size)
        return self.rows

    def get_paginated_response(self, data):
        next_link = None
        if self.more:
            next_link = replace_query_param(self.request.build_absolute_uri(), "cursor", f"after.{self.rows[-1].pk}")
        return Response({"next": next_link, "previous": None, "results": data})


class DeadLetterPagination(KeysetPagination):
    """The last to fail first."""

    keyset = reads.DEAD_LETTER_ORDER


# --- the schema ----------------------------------------------------------------------------------

# PostgreSQL text cannot hold NUL, and the API refuses it (DRF's character fields and check_json do):
# the schema says so on every free-text input. (The API also refuses unpaired surrogates, but a
# pattern cannot name them: JSON Schema validators match Unicode scalar values, which they are not.)
STORABLE_TEXT_PATTERN = "^[^\\u0000]*$"


def _storable_text(schema: dict) -> None:
    if schema.get("type") == "string" and not ({"enum", "format", "pattern"} & schema.keys()):
        schema["pattern"] = STORABLE_TEXT_PATTERN


def describe_text_inputs(result, generator, request, public):
    """drf-spectacular postprocessing hook: the storable-text pattern on the string properties of
    request bodies and on string parameters."""
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request"):
            for prop in component.get("properties", {}).values():
                _storable_text(prop)
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                _storable_text(parameter.get("schema", {}))
    return result
