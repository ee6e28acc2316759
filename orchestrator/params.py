"""Run parameters: checking the values given to a run against the params a workflow declares.

The declared params live in the graph version's spec (``{"name": {"type": "int", "default": 3,
"required": false, "choices": [...]}}``), so the web form, the API and the scheduler all check
against what is stored, not against a module that may have changed since.
"""

from __future__ import annotations

import json
import math
from datetime import date, datetime

from orchestrator.limits import MAX_JSON_DEPTH, json_problem, text_error

# Integers a task can hand to PostgreSQL or any JSON consumer: a bigint.
INT_RANGE = (-(2**63), 2**63 - 1)


class ParamError(ValueError):
    """Invalid params; ``errors`` maps each bad field to a message."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__("; ".join(f"{key}: {message}" for key, message in errors.items()))


def _as_str(value):
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {_shown(value)}")
    return value


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _as_bool(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"expected true or false, got {_shown(value)}")


def _as_int(value):
    number = None
    # bool is an int subclass, but True is not a count.
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and len(value) <= 100:  # int() of thousands of digits costs, then fails
        try:
            number = int(value.strip())
        except ValueError:
            pass
    if number is None:
        raise ValueError(f"expected an integer, got {_shown(value)}")
    if not INT_RANGE[0] <= number <= INT_RANGE[1]:
        raise ValueError(f"expected an integer from {INT_RANGE[0]} to {INT_RANGE[1]}, got {_shown(value)}")
    return number


def _as_float(value):
    number = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value) if abs(value) < 2**1023 else math.inf
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            pass
    if number is None:
        raise ValueError(f"expected a number, got {_shown(value)}")
    if not math.isfinite(number):
        # JSON has no infinity or NaN: PostgreSQL would refuse to store the run's params.
        raise ValueError(f"expected a finite number, got {_shown(value)}")
    return number


def _as_date(value):
    try:
        return date.fromisoformat(str(value).strip()).isoformat()
    except ValueError:
        raise ValueError(f"expected a date like 2026-01-31, got {_shown(value)}") from None


def _as_datetime(value):
    try:
        parsed = datetime.fromisoformat(str(value).strip())
    except ValueError:
        raise ValueError(f"expected a date and time like 2026-01-31T08:00:00+00:00, got {_shown(value)}") from None
    if parsed.tzinfo is None:
        raise ValueError(f"{_named(value)} has no timezone; add one, e.g. +00:00")
    return parsed.isoformat()


def _as_json(kind: str):
    expected = list if kind == "list" else dict

    def coerce(value):
        # A form sends JSON text; the API sends the value itself.
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except RecursionError:
                # Where the parser gives up depends on the Python version (3.12: about 1,000 levels).
                raise ValueError(f"expected a JSON {kind}, got {_shown(value)}: nested deeper than "
                                 f"{MAX_JSON_DEPTH} levels") from None
            except ValueError:
                raise ValueError(f"expected a JSON {kind}, got {_shown(value)}") from None
        if not isinstance(value, expected):
            raise ValueError(f"expected a JSON {kind}, got {_shown(value)}")
        return value

    return coerce


_COERCE = {"str": _as_str, "bool": _as_bool, "int": _as_int, "float": _as_float, "date": _as_date,
           "datetime": _as_datetime, "list": _as_json("list"), "dict": _as_json("dict")}


def _coerce(kind: str, value):
    """Turn a value from JSON or a form field into the declared type, or raise ValueError."""
    coerce = _COERCE.get(kind)
    if coerce is None:
        raise ValueError(f"unknown param type {kind!r}")
    return coerce(value)


def _shown(value) -> str:
    """The value as JSON for a message, cut short: a message never repeats a huge input whole."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= 80 else f"{text[:80]}... ({len(text):,} characters)"


def _named(text: str) -> str:
    return repr(text) if len(text) <= 80 else f"{text[:80]!r}... ({len(text):,} characters)"


def clean_param(spec: dict, value):
    cleaned = _coerce(spec.get("type", "str"), value)
    # What a jsonb column cannot hold: text with NUL or unpaired surrogates, NaN, deep nesting.
    problem = text_error(cleaned, "the value") if isinstance(cleaned, str) else json_problem(cleaned)
    if problem:
        raise ValueError(problem)
    choices = spec.get("choices")
    if choices is not None and cleaned not in choices:
        raise ValueError(f"{_shown(cleaned)} is not one of {_shown(choices)}")
    return cleaned


def clean_params(declared: dict[str, dict], values: dict | None) -> dict:
    """Return the full params of a run (defaults filled in), or raise ParamError."""
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ParamError({"params": f"expected an object of param values, got {_shown(values)}"})
    errors: dict[str, str] = {}
    cleaned: dict = {}
    for key in values:
        if key not in declared:
            known = ", ".join(sorted(declared)) or "none"
            errors[key] = f"unknown param {_named(key)} (declared params: {known})"
    for key, spec in declared.items():
        if key in values and values[key] is not None:
            try:
                cleaned[key] = clean_param(spec, values[key])
            except ValueError as exc:
                errors[key] = str(exc)
        elif spec.get("required"):
            errors[key] = "this param is required"
        else:
            cleaned[key] = spec.get("default")
    if errors:
        raise ParamError(errors)
    return cleaned
