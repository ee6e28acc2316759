"""What the API reads from a request besides its serializers: the JSON body, the query parameters of
its lists, and the cursor and page size of their pages.

Every rule here is also written into the OpenAPI schema (the patterns and ranges of the parameters
below), so a client can tell a good request from a bad one without sending it; the fuzz test
(tests/test_api_fuzz.py) checks that the server and the schema agree.

Pages are keyset pages, newest first. A cursor names the row a page starts after:
``older.<id>`` lists the rows older than run (or job, backfill) ``<id>``, ``newer.<id>`` the rows
newer than it; the dead-letter queue, ordered by when each task run died, uses
``older.<microseconds since 1970>.<id>``. Every string of that form is a valid cursor, even one that
points past the end (its page is empty), and page 10,000 costs what page 1 does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import Q
from drf_spectacular.utils import OpenApiParameter
from rest_framework import parsers
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.pagination import BasePagination
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

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
_ID = "[0-9]{1,18}"  # 18 digits: every value fits a bigint
_MICROSECONDS = "[0-9]{1,17}"  # 17 digits: every value is a date before the year 5000
ID_CURSOR_PATTERN = rf"^(older|newer)\.{_ID}$"
TIME_CURSOR_PATTERN = rf"^(older|newer)\.{_MICROSECONDS}\.{_ID}$"
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
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def page_size(request) -> int:
    text = request.query_params.get("limit")
    if text is None:
        return PAGE_SIZE
    if not re.fullmatch(r"[0-9]{1,6}", text) or not 1 <= int(text) <= MAX_PAGE_SIZE:
        raise ValidationError({"limit": [f"must be a whole number from 1 to {MAX_PAGE_SIZE}, got {shown(text)}"]})
    return int(text)


@dataclass(frozen=True)
class _Cursor:
    older: bool  # the rows after the key in the list's order, or (False) the rows before it
    key: tuple


class KeysetPagination(BasePagination):
    """Newest first by id. Subclasses order by another column first (``time_field``)."""

    time_field: str | None = None

    @property
    def pattern(self) -> str:
        return TIME_CURSOR_PATTERN if self.time_field else ID_CURSOR_PATTERN

    def _cursor(self, request) -> _Cursor | None:
        text = request.query_params.get("cursor")
        if text is None:
            return None
        if not re.fullmatch(self.pattern, text):
            example = "older.1767225600000000.42" if self.time_field else "older.42"
            raise ValidationError({"cursor": [f"expected a cursor like {example!r} (from a page's next or previous "
                                              f"link), got {shown(text)}"]})
        direction, *numbers = text.split(".")
        if self.time_field:
            return _Cursor(direction == "older", (_EPOCH + timedelta(microseconds=int(numbers[0])), int(numbers[1])))
        return _Cursor(direction == "older", (int(numbers[0]),))

    def _key(self, row) -> tuple:
        if self.time_field:
            # A dead task run always has its finished_at; a row without one (edited by hand) gets a
            # cursor rather than a crash.
            return getattr(row, self.time_field) or _EPOCH, row.pk
        return (row.pk,)

    def _encode(self, older: bool, key: tuple) -> str:
        direction = "older" if older else "newer"
        if self.time_field:
            at, pk = key
            return f"{direction}.{(at - _EPOCH) // timedelta(microseconds=1)}.{pk}"
        return f"{direction}.{key[0]}"

    def _after(self, cursor: _Cursor) -> Q:
        """The rows past the cursor's key, in its direction (a row comparison, spelled out for the ORM)."""
        op = "lt" if cursor.older else "gt"
        if self.time_field:
            at, pk = cursor.key
            return Q(**{f"{self.time_field}__{op}": at}) | Q(**{self.time_field: at, f"pk__{op}": pk})
        return Q(**{f"pk__{op}": cursor.key[0]})

    def _order(self, newest_first: bool) -> list[str]:
        sign = "-" if newest_first else ""
        return [f"{sign}{self.time_field}", f"{sign}id"] if self.time_field else [f"{sign}id"]

    def paginate_queryset(self, queryset, request, view=None):
        self.request = request
        size = page_size(request)
        cursor = self._cursor(request)
        if cursor is not None:
            queryset = queryset.filter(self._after(cursor))
        newest_first = cursor is None or cursor.older
        # One row more than the page tells whether another page follows: no COUNT, no OFFSET.
        rows = list(queryset.order_by(*self._order(newest_first))[: size + 1])
        more = len(rows) > size
        rows = rows[:size]
        if not newest_first:
            rows.reverse()
        self.older_key = self._key(rows[-1]) if rows and (more or not newest_first) else None
        self.newer_key = self._key(rows[0]) if rows and (cursor is not None if newest_first else more) else None
        return rows

    def _link(self, older: bool, key: tuple | None) -> str | None:
        if key is None:
            return None
        return replace_query_param(self.request.build_absolute_uri(), "cursor", self._encode(older, key))

    def get_paginated_response(self, data):
        return Response({"next": self._link(True, self.older_key), "previous": self._link(False, self.newer_key),
                         "results": data})


class DeadLetterPagination(KeysetPagination):
    """The last to fail first."""

    time_field = "finished_at"


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
