"""The limits of input, in one place: names, queues, priorities, references, lengths, and what
PostgreSQL can store. Sync, jobs and the registry check against these, so a value is refused
with the same rule wherever it comes from.

The lengths are the columns' sizes in ``models.py``: a value over one would otherwise reach the
database and fail there as a ``DataError``, after other rows were written.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY

# Workflow and task names appear in URLs (/workflows/<name>/): no '/', no spaces, no '%'.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
NAME_RULE = "use letters, digits, '_', '-' or '.', starting with a letter or digit, at most 200 characters"
QUEUE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
QUEUE_RULE = "use letters, digits, '_', '-' or '.', starting with a letter or digit, at most 100 characters"
# "package.module:function" (the attribute may be dotted: "module:Class.method").
REF_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
REF_RULE = "must look like 'package.module:function'"
# A job's task run is named by its reference (TaskRun.task).
MAX_REF_LENGTH = 255

# Django's task priority range, so a django.tasks task and a workflow task or job share one scale.
PRIORITY_MIN, PRIORITY_MAX = TASK_MIN_PRIORITY, TASK_MAX_PRIORITY
# PositiveIntegerField and IntegerField columns (max_active_runs, jitter, max_attempts, ...).
MAX_INT = 2**31 - 1
# The attempts one task run may be given (a DSL task's retries + 1, a job's max_attempts, through
# the API, the python API or a django.tasks backend's OPTIONS): a thousand tries with the longest
# backoff is weeks of retrying, and each clear or retry adds a fresh allowance to the attempts
# made, so the int column stays far from overflowing.
MAX_ATTEMPTS = 1000

# Column sizes.
WORKFLOW_NAME = 200
MODULE = 300
OWNER = 200
TENANT = 200
SCHEDULE_NAME = 100
CRON = 200
TIMEZONE = 64
QUEUE = 100
TASK_NAME = 255
URL = 500
EMAIL = 254

# jsonb nests deeper than anyone needs; a value nested past this is a mistake or an attack.
MAX_JSON_DEPTH = 32
# How much of a bad value an error message quotes.
REPR_LIMIT = 120


def safe_repr(value, limit: int = REPR_LIMIT) -> str:
    """``repr(value)`` for an error message: bounded, never raising, and storable (no NUL)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a user object's __repr__ may fail; the message must not
        text = f"<{type(value).__name__} object>"
    text = text.replace("\x00", "\\x00")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def text_problem(value, max_length: int, *, allow_empty: bool = True) -> str | None:
    """What makes ``value`` unfit for a text column of ``max_length`` characters, or None."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not allow_empty and not value.strip():
        return "must not be empty"
    if "\x00" in value:
        return "contains a NUL character, which PostgreSQL cannot store"
    if len(value) > max_length:
        return f"is {len(value)} characters long; at most {max_length} fit"
    return None


def int_problem(value, minimum: int = 0, maximum: int = MAX_INT) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be a whole number, got {type(value).__name__}"
    if not minimum <= value <= maximum:
        return f"must be from {minimum} to {maximum}"
    return None


def number_problem(value, minimum: float = 0.0, maximum: float = float(MAX_INT)) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number, got {type(value).__name__}"
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    if not minimum <= value <= maximum:
        return f"must be from {minimum:g} to {maximum:g}"
    return None


def json_problem(value, path: str = "", depth: int = 0) -> str | None:
    """What keeps ``value`` out of a jsonb column (a type JSON has not, NaN or infinity, a NUL
    character, too deep a nesting), naming where it is; None when it can be stored."""
    where = path or "the top level"
    if depth > MAX_JSON_DEPTH:
        return f"nested deeper than {MAX_JSON_DEPTH} levels at {where}"
    if value is None or isinstance(value, bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value!r} at {where} is not a JSON number"
    if isinstance(value, str):
        return text_error(value, f"the text at {where}")
    if isinstance(value, list | tuple | dict):
        return _items_problem(value, path, depth)
    return f"{safe_repr(value)} at {where} is a {type(value).__name__}, which JSON cannot hold"


def _items_problem(value: list | tuple | dict, path: str, depth: int) -> str | None:
    """json_problem of each item of a list or a dict (and of each key, which must be text)."""
    if not isinstance(value, dict):
        for index, item in enumerate(value):
            problem = json_problem(item, f"{path}[{index}]", depth + 1)
            if problem:
                return problem
        return None
    where = path or "the top level"
    for key, item in value.items():
        if not isinstance(key, str):
            return f"the key {safe_repr(key)} at {where} is not a string"
        inner = f"{path}.{shown(key)}" if path else shown(key)
        problem = json_problem(key, inner, depth + 1) or json_problem(item, inner, depth + 1)
        if problem:
            return problem
    return None


def routable(name) -> bool:
    """Whether a workflow name can appear in the UI's and the API's URLs."""
    return isinstance(name, str) and NAME_RE.match(name) is not None


# Primary keys are bigints: a larger id can name nothing, and PostgreSQL would refuse to compare it.
MAX_ID = 2**63 - 1

# Pages of API lists: a page costs one indexed query of at most MAX_PAGE_SIZE + 1 rows.
PAGE_SIZE = 50
MAX_PAGE_SIZE = 500

# Byte offsets into a task's log: 1 TiB is far beyond any log a task writes and below the largest
# offset every filesystem can seek to (ext4 refuses 16 TiB).
MAX_LOG_OFFSET = 2**40

# Logical dates a request may set (a trigger's logical_date, a backfill's start and end): the
# window where they mean something. A run's logical date is the moment its data belongs to; a date
# before 1900 or after 2199 is a typo (or a probe), and at the calendar's ends the time-zone
# arithmetic of schedules overflows.
LOGICAL_DATE_MIN = datetime(1900, 1, 1, tzinfo=UTC)
LOGICAL_DATE_MAX = datetime(2200, 1, 1, tzinfo=UTC)  # exclusive


def logical_date_error(value: datetime) -> str | None:
    """Why an aware datetime cannot be a logical date, or None when it can."""
    if LOGICAL_DATE_MIN <= value < LOGICAL_DATE_MAX:
        return None
    return (f"{value.isoformat()} is outside the range of logical dates, {LOGICAL_DATE_MIN:%Y-%m-%d} to "
            f"{LOGICAL_DATE_MAX.year - 1}-12-31 (UTC)")


_UNSTORABLE_RE = re.compile("[\x00\ud800-\udfff]")


def text_error(text: str, where: str) -> str | None:
    """Why `text` cannot be stored in PostgreSQL, or None. Text there cannot hold the NUL character, and
    UTF-8 cannot encode an unpaired surrogate (JSON's "\\ud800" decodes to one): either would fail in the
    database or its driver, so name where it is first."""
    found = _UNSTORABLE_RE.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return f"{where} contains a NUL character (\\x00), which cannot be stored"
    return f"{where} contains an unpaired surrogate (\\u{ord(found.group()):04x}), which is not valid Unicode"


def shown(text: str, limit: int = 80) -> str:
    """`text` for a message: at most `limit` characters of it, with NUL and unpaired surrogates
    written as escapes (a message holding one could not be sent as UTF-8, and a server error would
    replace the answer about bad input)."""
    clipped = text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"
    return _UNSTORABLE_RE.sub(lambda found: f"\\u{ord(found.group()):04x}", clipped)
