"""The field types of the API's input: each takes only the JSON type the schema states, and checks
what PostgreSQL or our modules would otherwise reject late (NUL bytes, integers out of range,
datetimes without a timezone, JSON nested too deep), so a bad request is a 400 naming the field.

DRF alone would read 0 as "0" for a string, "5" as 5 for an integer and "yes" as true, accepting
what the schema tells clients is wrong."""

from __future__ import annotations

import re
from datetime import UTC

from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from orchestrator.limits import json_problem


class AwareDateTimeField(serializers.DateTimeField):
    """An ISO 8601 date and time that must carry its timezone: a naive one is ambiguous, and
    guessing the server's zone would silently shift a job or a backfill by hours."""

    default_error_messages = {
        "invalid": "expected a date and time like 2026-01-31T08:00:00+00:00, got {input!r}",
        "naive": "{input!r} has no timezone; add one, e.g. +00:00 or Z",
        "range": "{input!r} is out of the supported range (years 1-9999 in UTC)",
    }

    def to_internal_value(self, value):
        if not isinstance(value, str):
            self.fail("invalid", input=value)
        try:
            parsed = parse_datetime(value.strip())
        except ValueError:
            parsed = None
        if parsed is None:
            self.fail("invalid", input=value)
        if parsed.tzinfo is None or parsed.utcoffset() is None:
            self.fail("naive", input=value)
        try:
            return parsed.astimezone(UTC)
        except (OverflowError, ValueError):
            self.fail("range", input=value)


class Text(serializers.CharField):
    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class TextMatching(serializers.RegexField):
    """Text that matches ``regex`` whole, as JSON Schema's ``pattern`` means it: Python's ``$`` would
    also take a trailing line break ("a:b\\n"), which the schema refuses."""

    def __init__(self, regex: str, **kwargs):
        self.whole = re.compile(regex)
        super().__init__(regex, **kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str) or not self.whole.fullmatch(data):
            self.fail("invalid")
        return super().to_internal_value(data)


class WholeNumber(serializers.IntegerField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class Number(serializers.FloatField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return super().to_internal_value(data)


class Flag(serializers.BooleanField):
    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class QueryInteger(serializers.IntegerField):
    """An integer in the query string: digits, nothing else (DRF would also take "5.0")."""

    def to_internal_value(self, data):
        if not isinstance(data, str) or len(data) > 20 or not data.lstrip("-").isascii() \
                or not data.lstrip("-").isdigit():
            self.fail("invalid")
        return super().to_internal_value(data)


def check_json(value) -> None:
    """What jsonb cannot hold (NUL, unpaired surrogates, deep nesting), found before the database does."""
    if problem := json_problem(value):
        raise serializers.ValidationError(problem)


@extend_schema_field({"type": "object", "additionalProperties": True})
class JSONObjectField(serializers.JSONField):
    default_error_messages = {"not_object": "expected a JSON object, got {kind}"}

    def to_internal_value(self, data):
        data = super().to_internal_value(data)
        if not isinstance(data, dict):
            self.fail("not_object", kind=type(data).__name__)
        check_json(data)
        return data


@extend_schema_field({"type": "array", "items": {}})
class JSONListField(serializers.JSONField):
    default_error_messages = {"not_list": "expected a JSON array, got {kind}"}

    def to_internal_value(self, data):
        data = super().to_internal_value(data)
        if not isinstance(data, list):
            self.fail("not_list", kind=type(data).__name__)
        check_json(data)
        return data


class IdempotencyKeyField(Text):
    def __init__(self, **kwargs):
        kwargs.setdefault("required", False)
        kwargs.setdefault("allow_null", True)
        kwargs.setdefault("max_length", 255)
        kwargs.setdefault("min_length", 1)
        kwargs.setdefault("help_text", "Retrying with the same key and payload returns the existing resource (200); "
                                       "the same key with a different payload is a 409. Also accepted as the "
                                       "Idempotency-Key header (a header and a field that differ are a 400).")
        super().__init__(**kwargs)
