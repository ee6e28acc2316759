"""Cron expressions: parsing into value sets, the matcher that walks them, and the messages of
:class:`CronError` (see the package docstring for the forms accepted)."""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError


class CronError(ValueError):
    """Invalid cron expression or timezone; ``str(e)`` is a clear human message naming the bad value,
    e.g. "invalid cron expression '61 * * * *': minute field value 61 is out of range 0-59" or
    "unknown timezone 'Mars/Olympus'".

    Messages about the expression never contain the word "timezone" and messages about the timezone
    always do: callers use that to tell which of the two inputs to blame.
    """


_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DOW_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
MONTH_FULL = ("", "January", "February", "March", "April", "May", "June", "July", "August", "September",
              "October", "November", "December")


@dataclass(frozen=True)
class _FieldSpec:
    name: str
    low: int
    high: int
    names: dict[str, int]
    names_hint: str = ""


_SECOND = _FieldSpec("second", 0, 59, {})
_MINUTE = _FieldSpec("minute", 0, 59, {})
_HOUR = _FieldSpec("hour", 0, 23, {})
_DOM = _FieldSpec("day-of-month", 1, 31, {})
_MONTH = _FieldSpec("month", 1, 12, {n: i + 1 for i, n in enumerate(_MONTH_NAMES)}, " (use JAN-DEC)")
_DOW = _FieldSpec("day-of-week", 0, 7, {n: i for i, n in enumerate(_DOW_NAMES)}, " (use SUN-SAT)")
_FIVE_FIELDS = (_MINUTE, _HOUR, _DOM, _MONTH, _DOW)

_TOKEN_RE = re.compile(r"(?P<start>\*|[0-9a-zA-Z]+)(?:-(?P<end>[0-9a-zA-Z]+))?(?:/(?P<step>[^/]*))?", re.ASCII)
_DIGITS_RE = re.compile(r"[0-9]+", re.ASCII)
ONE_DAY = timedelta(days=1)


@dataclass(frozen=True)
class Parsed:
    """A parsed expression: the value sets the matcher walks, plus what describe() needs."""

    expression: str  # normalised, as written (aliases kept)
    tokens: tuple[str | None, ...]  # (second or None, minute, hour, day-of-month, month, day-of-week)
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    doms: frozenset[int]
    months: frozenset[int]
    dows: frozenset[int]  # cron numbering, Sunday = 0
    dom_star: bool
    dow_star: bool
    fixed: bool
    never: bool = False  # no calendar day can ever match (Feb 30)

    def _day_matches(self, d: date) -> bool:
        # Vixie/Debian cron: if either day field starts with "*" both must match, otherwise either may.
        if self.dom_star or self.dow_star:
            return d.day in self.doms and d.isoweekday() % 7 in self.dows
        return d.day in self.doms or d.isoweekday() % 7 in self.dows

    def _time_at_or_after(self, h: int, m: int, s: int) -> tuple[int, int, int] | None:
        hours, minutes, seconds = self.hours, self.minutes, self.seconds
        i = bisect_left(hours, h)
        if i < len(hours) and hours[i] == h:
            j = bisect_left(minutes, m)
            if j < len(minutes) and minutes[j] == m:
                k = bisect_left(seconds, s)
                if k < len(seconds):
                    return h, m, seconds[k]
                j += 1
            if j < len(minutes):
                return h, minutes[j], seconds[0]
            i += 1
        if i < len(hours):
            return hours[i], minutes[0], seconds[0]
        return None

    def next_match(self, lo: datetime, hi: datetime) -> datetime | None:
        """First naive wall time matching the expression in [lo, hi). Jumps by whole days and months,
        never minute by minute, so even a yearly schedule costs a few hundred cheap steps."""
        d = lo.date()
        last_day = hi.date()
        tod: tuple[int, int, int] | None = (lo.hour, lo.minute, lo.second)
        while d <= last_day:
            if d.month not in self.months:
                if d.year == 9999 and d.month == 12:
                    return None  # the calendar ends here
                d = date(d.year + 1, 1, 1) if d.month == 12 else date(d.year, d.month + 1, 1)
                tod = None
                continue
            if self._day_matches(d):
                found = self._time_at_or_after(*tod) if tod else (self.hours[0], self.minutes[0], self.seconds[0])
                if found is not None:
                    candidate = datetime(d.year, d.month, d.day, *found)
                    return candidate if candidate < hi else None
            if d == last_day:
                return None  # also keeps d + 1 day from overflowing at the end of the calendar
            d += ONE_DAY
            tod = None
        return None


MAX_LENGTH = 1000  # the longest sensible expression (every value of every field listed) is about 550
_SHOWN = 80  # messages quote at most this much of the input, so a huge input cannot make a huge message


def _quote(text: str) -> str:
    return f"'{text}'" if len(text) <= _SHOWN else f"'{text[:_SHOWN]}...' ({len(text):,} characters)"


def _clip(text: str) -> str:
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text):,} characters)"


def _shown(value: object) -> str:
    return _quote(value) if isinstance(value, str) else _clip(repr(value))


def bad(expr: object, why: str) -> CronError:
    return CronError(f"invalid cron expression {_shown(expr)}: {why}")


def join(items: list[str], word: str = "and") -> str:
    if len(items) == 1:
        return items[0]
    return f"{', '.join(items[:-1])} {word} {items[-1]}"


def _number(text: str) -> int | None:
    """The value of a run of ASCII digits, or None. Long runs are not converted: every field ends below
    100, and int() refuses more than 4,300 digits with a ValueError of its own."""
    if not _DIGITS_RE.fullmatch(text):
        return None
    return int(text) if len(text) <= 6 else 10**6


def _parse_value(expr: str, spec: _FieldSpec, text: str) -> int:
    value = _number(text)
    if value is None:
        if text.lower() in spec.names:
            return spec.names[text.lower()]
        if spec.names:
            raise bad(expr, f"{spec.name} field name {_quote(text)} is not recognised{spec.names_hint}")
        raise bad(expr, f"{spec.name} field value {_quote(text)} is not a number")
    if not spec.low <= value <= spec.high:
        raise bad(expr, f"{spec.name} field value {_clip(text)} is out of range {spec.low}-{spec.high}")
    return value


def _parse_step(expr: str, spec: _FieldSpec, step_text: str | None) -> int:
    if step_text is None:
        return 1
    step = _number(step_text)
    if step is None:
        raise bad(expr, f"{spec.name} field step {_quote(step_text)} is not a number")
    if len(step_text) > 6:
        raise bad(expr, f"{spec.name} field step {_clip(step_text)} is too large")
    if step < 1:
        raise bad(expr, f"{spec.name} field step {step_text} must be at least 1")
    return step


def _expand_item(expr: str, spec: _FieldSpec, field: str, item: str) -> set[int]:
    if not item:
        raise bad(expr, f"{spec.name} field {_quote(field)} has an empty list item")
    match = _TOKEN_RE.fullmatch(item) if item.isascii() else None
    if match is None or (match["start"] == "*" and match["end"] is not None):
        raise bad(expr, f"{spec.name} field item {_quote(item)} is not a number, name, range, list or step")
    start, end, step_text = match.group("start", "end", "step")
    step = _parse_step(expr, spec, step_text)
    # Day of week 7 is another Sunday. "*" covers 0-6 (with a step, 0-7 would give the same days), and a
    # reversed range wraps within 0-6; "a/n" runs to 7, the end of the field, as in cron (7/2 is Sunday).
    top = 6 if spec is _DOW else spec.high
    if start == "*":
        low, high = spec.low, top
    else:
        low = _parse_value(expr, spec, start)
        if end is not None:
            high = _parse_value(expr, spec, end)
        else:
            high = spec.high if step_text is not None else low  # "a/n" runs from a to the end of the field
    if spec is _DOW and low > high:
        low, high = low % 7, high % 7
    if low <= high:
        values = list(range(low, high + 1, step))
    else:
        # A reversed range wraps around the end of the field (22-2, FRI-MON), as croniter reads it, and a step
        # keeps counting across the wrap: 50-10/7 is :50, :57 and :04, seven minutes apart (croniter is one off
        # after the wrap and gives :05).
        values = [*range(low, top + 1), *range(spec.low, high + 1)][::step]
    return {v % 7 for v in values} if spec is _DOW else set(values)


def _expand_field(expr: str, spec: _FieldSpec, field: str) -> tuple[int, ...]:
    """Own expansion rather than croniter's: croniter reads an equal range such as 5-5 as the whole field
    (so "0 5-5 * * *" would fire hourly) and its messages do not say which value is wrong."""
    values: set[int] = set()
    for item in field.split(","):
        values |= _expand_item(expr, spec, field, item)
    return tuple(sorted(values))


@lru_cache(maxsize=4096)
def parse(expr: str) -> Parsed:
    if len(expr) > MAX_LENGTH:
        raise bad(expr, f"it is longer than {MAX_LENGTH:,} characters")
    normalised = " ".join(expr.split())
    if not normalised:
        raise bad(expr, "it is empty")
    body = normalised
    if normalised.startswith("@"):
        body = _ALIASES.get(normalised.lower(), "")
        if not body:
            raise bad(expr, f"{_clip(normalised)} is not supported (use one of {', '.join(_ALIASES)})")
    fields = body.split(" ")
    if len(fields) == 5:
        tokens: tuple[str | None, ...] = (None, *fields)
    elif len(fields) == 6:
        tokens = tuple(fields)  # the seconds field comes first
    else:
        raise bad(
            expr,
            f"expected 5 fields (minute hour day-of-month month day-of-week) or 6 with a leading seconds "
            f"field, got {len(fields)}",
        )
    second, minute, hour, dom, month, dow = tokens
    schedule = Parsed(
        expression=normalised,
        tokens=tokens,
        seconds=(0,) if second is None else _expand_field(expr, _SECOND, second),
        minutes=_expand_field(expr, _MINUTE, minute),
        hours=_expand_field(expr, _HOUR, hour),
        doms=frozenset(_expand_field(expr, _DOM, dom)),
        months=frozenset(_expand_field(expr, _MONTH, month)),
        dows=frozenset(_expand_field(expr, _DOW, dow)),
        dom_star=dom.startswith("*"),
        dow_star=dow.startswith("*"),
        # Debian cron decides from the first character of each field (entry.c sets MIN_STAR/HR_STAR when it
        # reads a leading "*"), so "52,*/45 2 * * *" is fixed-time and "*/15 3 * * *" is not.
        fixed=not minute.startswith("*") and not hour.startswith("*"),
    )
    if _never_fires(schedule):
        schedule = replace(schedule, never=True)
    return schedule


_MAX_DAYS = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}


def _never_fires(schedule: Parsed) -> bool:
    # When either day may match (neither field starts with "*"), the weekdays alone always occur. When both
    # must, a valid (month, day) pair is enough: over the years every date falls on every weekday.
    if not (schedule.dom_star or schedule.dow_star):
        return False
    return all(day > _MAX_DAYS[month] for month in schedule.months for day in schedule.doms)


def parsed(expr: object) -> Parsed:
    """The parsed expression, or CronError. The type is checked before the cache, which would take any
    hashable value."""
    if not isinstance(expr, str):
        raise bad(expr, f"expected a string, got {type(expr).__name__}")
    return parse(expr)


def time_zone(name: object) -> ZoneInfo:
    shown = _shown(name)
    # "localtime" resolves to whatever the host is set to; a schedule must mean the same on every worker.
    if not isinstance(name, str) or not name or name != name.strip() or name == "localtime":
        raise CronError(f"unknown timezone {shown}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise CronError(f"unknown timezone {shown}") from exc

