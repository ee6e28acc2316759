"""All cron arithmetic of the orchestrator, behind one core function: :func:`fire_times`.

The scheduler, backfills, UI previews and validation all go through this module so that every part of the
product agrees on what a schedule means. It deliberately imports nothing from Django.

Expressions
-----------
* Five fields: ``minute hour day-of-month month day-of-week``. Each field takes ``*``, numbers, names
  (``JAN``-``DEC`` in the month field, ``SUN``-``SAT`` in the day-of-week field, any case), ranges ``a-b``,
  lists ``a,b,c`` and steps ``*/n``, ``a-b/n`` or ``a/n`` (from a to the end of the field). Day of week 0
  and 7 are both Sunday, and 7 is the end of that field, as in cron: ``7/2`` is Sunday alone and ``1/2`` is
  Monday, Wednesday, Friday and Sunday. A range whose start is above its end wraps around (``FRI-MON``,
  ``22-2``); a step keeps counting across the wrap (``50-10/7`` is :50, :57 and :04, seven minutes apart).
* Six fields: an optional **seconds field first**: ``*/10 * * * * *`` fires every 10 seconds and
  ``30 0 3 * * *`` at 03:00:30 every day.
* Aliases: ``@hourly`` ``@daily`` ``@midnight`` ``@weekly`` ``@monthly`` ``@yearly`` ``@annually``.
* Runs of whitespace are normalised. Anything else (``@reboot``, seven fields, the croniter extensions
  ``L``, ``W``, ``#``, ``?`` and ``H``, out-of-range values, non-strings, more than 1,000 characters) is
  rejected with a :class:`CronError`, whose message quotes at most the first 80 characters of the input.
* Days, as in Vixie/Debian cron: if the day-of-month or the day-of-week field starts with ``*``, a day must
  match both; otherwise it may match either (``0 0 1,15 * MON`` is the 1st, the 15th and every Monday, while
  ``0 0 */2 * MON`` is the odd-numbered days that are Mondays).

croniter is not used at run time: it reads an equal range such as ``5-5`` as the whole field (so
``0 5-5 * * *`` would fire hourly), its error messages do not say which value is wrong, and a get_next()
costs tens of microseconds, too slow for the scheduler's every-schedule sweeps. For the forms above the
value sets agree with croniter's (the tests compare them), except where this module follows cron: equal
ranges, the day rule (croniter's default treats ``*/2`` with a weekday as "either"), ``a/n`` in the
day-of-week field (croniter stops at Saturday, and reads ``7/2`` as every other day from Sunday) and a
reversed range with a step (croniter is one off after the wrap: ``50-10/7`` gives it :05).

Time zones and daylight saving time (Debian cron's rules)
---------------------------------------------------------
Matching happens on the wall clock of the schedule's IANA time zone; results are UTC instants between
0001-01-02 and 9999-12-30 (a day inside the calendar's ends, so every zone's wall time exists there).

* A *fixed-time* job is one whose minute field and hour field both start with something other than ``*``
  (``@daily`` and ``52,*/45 2 * * *`` are, ``@hourly`` and ``*/15 3 * * *`` are not). Debian cron looks at
  the first character only, and so does this module; see :func:`is_fixed_time`.
* Spring forward: a fixed-time job whose wall time falls into the gap runs once, at the first instant after
  the gap, however many of its wall times the gap swallowed. Other jobs follow real elapsed time, so wall
  times inside the gap simply do not happen.
* Fall back: a fixed-time job runs once, in the first occurrence of the repeated wall time. Other jobs fire
  in both occurrences, because real time elapses in both.
"""

from __future__ import annotations

import hashlib
import re
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = [
    "CronError",
    "describe",
    "fire_times",
    "is_fixed_time",
    "jitter_offset",
    "next_fire_time",
    "preview",
    "validate",
]


class CronError(ValueError):
    """Invalid cron expression or timezone; ``str(e)`` is a clear human message naming the bad value,
    e.g. "invalid cron expression '61 * * * *': minute field value 61 is out of range 0-59" or
    "unknown timezone 'Mars/Olympus'".

    Messages about the expression never contain the word "timezone" and messages about the timezone
    always do: callers use that to tell which of the two inputs to blame.
    """


# ---------------------------------------------------------------------------------------------------------
# Parsing


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


@dataclass(frozen=True)
class _Schedule:
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
            d += _ONE_DAY
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


def _bad(expr: object, why: str) -> CronError:
    return CronError(f"invalid cron expression {_shown(expr)}: {why}")


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
            raise _bad(expr, f"{spec.name} field name {_quote(text)} is not recognised{spec.names_hint}")
        raise _bad(expr, f"{spec.name} field value {_quote(text)} is not a number")
    if not spec.low <= value <= spec.high:
        raise _bad(expr, f"{spec.name} field value {_clip(text)} is out of range {spec.low}-{spec.high}")
    return value


def _parse_step(expr: str, spec: _FieldSpec, step_text: str | None) -> int:
    if step_text is None:
        return 1
    step = _number(step_text)
    if step is None:
        raise _bad(expr, f"{spec.name} field step {_quote(step_text)} is not a number")
    if len(step_text) > 6:
        raise _bad(expr, f"{spec.name} field step {_clip(step_text)} is too large")
    if step < 1:
        raise _bad(expr, f"{spec.name} field step {step_text} must be at least 1")
    return step


def _expand_item(expr: str, spec: _FieldSpec, field: str, item: str) -> set[int]:
    if not item:
        raise _bad(expr, f"{spec.name} field {_quote(field)} has an empty list item")
    match = _TOKEN_RE.fullmatch(item) if item.isascii() else None
    if match is None or (match["start"] == "*" and match["end"] is not None):
        raise _bad(expr, f"{spec.name} field item {_quote(item)} is not a number, name, range, list or step")
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
def _parse(expr: str) -> _Schedule:
    if len(expr) > MAX_LENGTH:
        raise _bad(expr, f"it is longer than {MAX_LENGTH:,} characters")
    normalised = " ".join(expr.split())
    if not normalised:
        raise _bad(expr, "it is empty")
    body = normalised
    if normalised.startswith("@"):
        body = _ALIASES.get(normalised.lower(), "")
        if not body:
            raise _bad(expr, f"{_clip(normalised)} is not supported (use one of {', '.join(_ALIASES)})")
    fields = body.split(" ")
    if len(fields) == 5:
        tokens: tuple[str | None, ...] = (None, *fields)
    elif len(fields) == 6:
        tokens = tuple(fields)  # the seconds field comes first
    else:
        raise _bad(
            expr,
            f"expected 5 fields (minute hour day-of-month month day-of-week) or 6 with a leading seconds "
            f"field, got {len(fields)}",
        )
    second, minute, hour, dom, month, dow = tokens
    schedule = _Schedule(
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


def _never_fires(schedule: _Schedule) -> bool:
    # When either day may match (neither field starts with "*"), the weekdays alone always occur. When both
    # must, a valid (month, day) pair is enough: over the years every date falls on every weekday.
    if not (schedule.dom_star or schedule.dow_star):
        return False
    return all(day > _MAX_DAYS[month] for month in schedule.months for day in schedule.doms)


def _schedule(expr: object) -> _Schedule:
    if not isinstance(expr, str):
        raise _bad(expr, f"expected a string, got {type(expr).__name__}")
    return _parse(expr)


def _zone(name: object) -> ZoneInfo:
    shown = _shown(name)
    # "localtime" resolves to whatever the host is set to; a schedule must mean the same on every worker.
    if not isinstance(name, str) or not name or name != name.strip() or name == "localtime":
        raise CronError(f"unknown timezone {shown}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise CronError(f"unknown timezone {shown}") from exc


# ---------------------------------------------------------------------------------------------------------
# UTC offset transitions
#
# zoneinfo has no public way to list transitions, so they are found by probing the offset once a day and
# bisecting to the second, once per zone and month (cached). Two changes that cancel out within one probe
# interval would be missed: in the tz database the closest such pair is 3.99 days apart (Africa/Freetown,
# 1939). For every zone, the transitions found this way from 1850 to the end of the zone's table were
# checked to be exactly those of its TZif file (tzdata 2025/2026); the tests check the closest pairs. The
# zones of the Etc area and UTC's aliases have one offset by definition and are never probed.

_ONE_SECOND = timedelta(seconds=1)
_ONE_DAY = timedelta(days=1)
_PROBE = timedelta(days=1)
# Every search gives up after this long without a fire time, so nothing can hang. It is long because a
# valid schedule can be rare: "0 0 29 2 */7" (Feb 29 that is a Sunday) comes round every 28 years, and
# longer across 2100, which is not a leap year.
_HORIZON = timedelta(days=50 * 366)
# Fire times lie in [_FIRST, _LAST] (naive UTC): a day inside datetime's range, so that adding any zone's
# offset (under 16 hours, even in the local mean times of the 1800s) never leaves it.
_FIRST = datetime(1, 1, 2)
_LAST = datetime(9999, 12, 30)
# How many months _segment_end looks ahead for a transition before settling for a month boundary where
# nothing changes: more than a year, so that a zone with DST always shows its next change.
_LOOKAHEAD_MONTHS = 13
# Where a schedule fires rarely (Feb 29), the walk jumps from a segment's end to a day before the next
# matching wall time instead of visiting every segment in between (two a year in most zones). Every fire
# time after the segment's end has a wall time at most _LOOK_BACK before the end's wall time (an offset
# changes by a day at most, Samoa in 2011, and offsets stay under 16 hours), and fires less than a day
# before its wall time, so the jump skips nothing.
_LOOK_BACK = timedelta(days=3)
_FIXED_ZONE_RE = re.compile(r"(Etc/)?(UTC|UCT|Universal|Zulu|Greenwich|GMT([+-][0-9]{1,2}|0)?)", re.ASCII)


def _later(instant: datetime, delta: timedelta) -> datetime:
    """instant + delta, but never past _LAST (and so never past datetime.max)."""
    return _LAST if instant >= _LAST - delta else instant + delta


def _offset(zone: ZoneInfo, instant: datetime) -> timedelta:
    # Clamped into [_FIRST, _LAST]: near datetime's ends the conversion to local time would overflow.
    instant = min(max(instant, _FIRST), _LAST)
    return instant.replace(tzinfo=UTC).astimezone(zone).utcoffset()


def _next_month(year: int, month: int) -> tuple[int, int]:
    return (year + 1, 1) if month == 12 else (year, month + 1)


def _month_start(year: int, month: int) -> datetime:
    return datetime(year, month, 1) if year <= 9999 else datetime.max


@lru_cache(maxsize=1024)
def _fixed_zone(zone_key: str) -> bool:
    return _FIXED_ZONE_RE.fullmatch(zone_key) is not None


@lru_cache(maxsize=16384)
def _transitions_in_month(zone_key: str, year: int, month: int) -> tuple[datetime, ...]:
    """Naive UTC instants in (the 1st of the month, the 1st of the next month] at which the zone's UTC offset
    changes."""
    if _fixed_zone(zone_key):
        return ()
    zone = ZoneInfo(zone_key)
    t, end = _month_start(year, month), _month_start(*_next_month(year, month))
    off = _offset(zone, t)
    found = []
    while t < end:
        probe = t + min(_PROBE, end - t)
        if _offset(zone, probe) == off:
            t = probe
            continue
        lo, hi = 0, int((probe - t).total_seconds())
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if _offset(zone, t + timedelta(seconds=mid)) == off:
                lo = mid
            else:
                hi = mid
        t = t + timedelta(seconds=hi)
        off = _offset(zone, t)
        found.append(t)
    return tuple(found)


@lru_cache(maxsize=16384)
def _first_transition_from(zone_key: str, year: int, month: int) -> datetime:
    """The first transition in this month or the next few, or, if there is none, the start of the month after
    those: a boundary at which the offset does not change (harmless: nothing happens there)."""
    for _ in range(_LOOKAHEAD_MONTHS):
        if year > 9999:
            return datetime.max
        found = _transitions_in_month(zone_key, year, month)
        if found:
            return found[0]
        year, month = _next_month(year, month)
    return _month_start(year, month)


def _segment_end(zone_key: str, instant: datetime) -> datetime:
    """The next transition after `instant` (see _first_transition_from)."""
    if _fixed_zone(zone_key):
        return datetime.max
    for at in _transitions_in_month(zone_key, instant.year, instant.month):
        if at > instant:
            return at
    return _first_transition_from(zone_key, *_next_month(instant.year, instant.month))


def _segment_start(zone_key: str, instant: datetime) -> datetime | None:
    # Only a transition within the last day matters (the repeated hour of a fall-back), so this month and
    # the one before are plenty; the one before also holds a transition at exactly midnight of the 1st.
    year, month = instant.year, instant.month
    for _ in range(2):
        if year < 1:
            break
        for at in reversed(_transitions_in_month(zone_key, year, month)):
            if at <= instant:
                return at
        year, month = (year - 1, 12) if month == 1 else (year, month - 1)
    return None


# ---------------------------------------------------------------------------------------------------------
# The core


def _naive_utc(value: object, name: str) -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, got {type(value).__name__}")
    offset = value.utcoffset()
    if offset is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got naive {value.isoformat()}")
    try:
        return value.replace(tzinfo=None) - offset
    except OverflowError:
        # 0001-01-01T00:00+05:00 is before datetime.min in UTC (and the reverse at the other end).
        return datetime.min if offset > timedelta(0) else datetime.max


def _stop(deadline: datetime, until: datetime | None) -> datetime:
    return deadline if until is None else min(deadline, until)


def _segment_at(zone: ZoneInfo, instant: datetime) -> tuple[datetime | None, timedelta, timedelta, datetime]:
    """(start, offset before start, offset, end) of the segment of constant offset that holds `instant`."""
    start = _segment_start(zone.key, instant)
    off = _offset(zone, instant)
    before_off = off if start is None else _offset(zone, start - _ONE_SECOND)
    return start, before_off, off, _segment_end(zone.key, instant)


def _candidates(schedule: _Schedule, zone: ZoneInfo, after: datetime, until: datetime | None) -> Iterator[datetime]:
    """Naive UTC fire instants after `after`, non-decreasing (a gap can produce the same instant twice).

    Time is cut into segments of constant UTC offset. Inside one, wall time and UTC move in lockstep, so
    matching wall times convert to UTC by one subtraction and stay ordered. Wall times inside a
    spring-forward gap belong to no segment and those of a repeated hour to two, which is exactly "follow
    real elapsed time"; the fixed-time exceptions are applied where a segment starts.
    """
    deadline = _later(after, _HORIZON)
    while after < _stop(deadline, until):
        # Enter the segment that holds `after`: at the start, and again after each jump.
        start, before_off, off, end = _segment_at(zone, after)
        lo = (after + off).replace(microsecond=0) + _ONE_SECOND
        entered_at_start = False
        while True:
            if entered_at_start:
                lo = start + off
                if schedule.fixed and off > before_off and schedule.next_match(start + before_off, lo) is not None:
                    # Debian cron: a fixed-time job whose wall time was skipped runs once, right after the gap.
                    yield start
                    deadline = _later(start, _HORIZON)
            if schedule.fixed and start is not None and before_off > off:
                # The repeated wall times already had their turn in the first occurrence (or, with `after`
                # inside the second one, are in the past): a fixed-time job must not run a second time.
                lo = max(lo, start + before_off)
            while (wall := schedule.next_match(lo, min(end, _stop(deadline, until) + _ONE_SECOND) + off)) is not None:
                yield wall - off
                deadline = _later(wall - off, _HORIZON)
                lo = wall + _ONE_SECOND
            stop = _stop(deadline, until)
            if end > stop:
                return
            ahead = schedule.next_match(end + off - _LOOK_BACK, stop + _ONE_DAY)
            if ahead is None:
                return  # no wall time matches before the horizon or `until`: nothing more fires
            if ahead - _ONE_DAY > end:
                after = ahead - _ONE_DAY
                break  # jump over the segments in between
            start, before_off, off, end = end, off, _offset(zone, end), _segment_end(zone.key, end)
            entered_at_start = True


def fire_times(
    expr: str,
    timezone: str,
    after: datetime,
    *,
    until: datetime | None = None,
    limit: int | None = None,
) -> Iterator[datetime]:
    """THE core function. Yields aware UTC datetimes strictly after `after` (aware, any tz), in
    increasing order, up to and including `until` if given, at most `limit` items. Applies the
    DST rules of the module docstring.

    Arguments are checked when called, not when iteration starts. An expression that can never fire
    (``0 0 30 2 *``) yields nothing; every search is bounded, so nothing hangs.
    """
    schedule = _schedule(expr)
    zone = _zone(timezone)
    # Outside [_FIRST, _LAST] nothing fires; clamping keeps the arithmetic inside datetime's range.
    after_utc = max(_naive_utc(after, "after"), _FIRST - _ONE_SECOND)
    until_utc = None if until is None else min(_naive_utc(until, "until"), _LAST)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a whole number, 0 or more, or None, got {limit!r}")
    return _fire_times(schedule, zone, after_utc, until_utc, limit)


def _fire_times(
    schedule: _Schedule, zone: ZoneInfo, after: datetime, until: datetime | None, limit: int | None
) -> Iterator[datetime]:
    if schedule.never or limit == 0 or (until is not None and until <= after):
        return
    count = 0
    last = after
    for instant in _candidates(schedule, zone, after, until):
        if until is not None and instant > until:
            return
        if instant <= last:
            continue
        yield instant.replace(tzinfo=UTC)
        last = instant
        count += 1
        if count == limit:
            return


def next_fire_time(expr: str, timezone: str, after: datetime) -> datetime | None:
    """The first of :func:`fire_times`, or None for an expression that can never fire."""
    return next(fire_times(expr, timezone, after, limit=1), None)


def preview(expr: str, timezone: str, after: datetime, count: int = 5) -> list[tuple[datetime, datetime]]:
    """The next `count` fire times as (UTC, local aware) pairs; the local one carries the right ``fold``."""
    fires = list(fire_times(expr, timezone, after, limit=count))
    zone = _zone(timezone)
    return [(at, at.astimezone(zone)) for at in fires]


def validate(expr: str, timezone: str) -> None:
    """Raise :class:`CronError` for a bad expression or timezone, else return None.

    Stricter than :func:`fire_times` in one way: it also rejects expressions that can never fire, such as
    ``0 0 30 2 *``, because saving one is always a mistake; fire_times just yields nothing for them.
    """
    schedule = _schedule(expr)
    _zone(timezone)
    if schedule.never:
        days = _join([str(d) for d in sorted(schedule.doms)], "or")
        months = _join([_MONTH_FULL[m] for m in sorted(schedule.months)], "or")
        raise _bad(expr, f"it can never fire: day {days} does not occur in {months}")


def is_fixed_time(expr: str) -> bool:
    """True when neither the minute nor the hour field contains ``*`` (after alias expansion): such a job
    runs once after a spring-forward gap and once in a repeated hour. A seconds field does not matter."""
    return _schedule(expr).fixed


def jitter_offset(key: str, max_seconds: int) -> int:
    """A stable offset in [0, max_seconds] for spreading starts: SHA-256 of the UTF-8 key, read as a
    big-endian integer, modulo max_seconds + 1. Stable across processes and machines (unlike ``hash()``,
    which is salted per process); 0 when max_seconds <= 0."""
    if not isinstance(key, str):
        raise TypeError(f"key must be a string, got {type(key).__name__}")
    if max_seconds <= 0:
        return 0
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest, "big") % (int(max_seconds) + 1)


# ---------------------------------------------------------------------------------------------------------
# describe()

_MONTH_FULL = ("", "January", "February", "March", "April", "May", "June", "July", "August", "September",
               "October", "November", "December")
_DOW_FULL = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_STEP_RE = re.compile(r"\*/(\d+)")
_MAX_LISTED = 6


class _Undescribable(Exception):
    pass


def _join(items: list[str], word: str = "and") -> str:
    if len(items) == 1:
        return items[0]
    return f"{', '.join(items[:-1])} {word} {items[-1]}"


def _runs(values: list[int], name) -> list[str]:
    """["Monday to Friday"] for consecutive runs of three or more, else the items one by one."""
    out, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        if j - i >= 2:
            out.append(f"{name(values[i])} to {name(values[j])}")
        else:
            out.extend(name(v) for v in values[i : j + 1])
        i = j + 1
    if len(out) > _MAX_LISTED:
        raise _Undescribable
    return out


def _step(token: str, cycle: int) -> int | None:
    match = _STEP_RE.fullmatch(token)
    # "*/7" restarts at :00 every hour, so "every 7 minutes" would be a lie; only exact divisors read well.
    if match and cycle % int(match.group(1)) == 0:
        return int(match.group(1))
    return None


def _every(n: int, unit: str) -> str:
    return f"every {unit}" if n == 1 else f"every {n} {unit}s"


def _hour_span(schedule: _Schedule, hour_token: str) -> tuple[int, int] | None:
    """(first, last) hour when the hour field is one hour or one run of consecutive hours."""
    if "*" in hour_token or "," in hour_token or "/" in hour_token:
        return None
    hours = schedule.hours
    if list(hours) != list(range(hours[0], hours[-1] + 1)):
        return None
    return hours[0], hours[-1]


def _time_phrase(schedule: _Schedule) -> tuple[str, bool]:
    """The time-of-day part, and whether it is a list of clock times (which reads "every day at ...")."""
    sec_token, minute, hour = schedule.tokens[:3]
    if sec_token is not None and schedule.seconds != (0,):
        steps = (_seconds_phrase,)
    else:
        steps = (_minutes_phrase, _clock_times_phrase, _hour_span_phrase)
    for step in steps:
        phrase = step(schedule, minute, hour)
        if phrase is not None:
            return phrase
    raise _Undescribable


def _seconds_phrase(schedule: _Schedule, minute: str, hour: str) -> tuple[str, bool] | None:
    """"every 10 seconds", "every minute at second 5", "at 03:00:30": a seconds field other than 0."""
    sec_token, seconds = schedule.tokens[0], schedule.seconds
    if minute == "*" and hour == "*":
        if sec_token == "*":
            return "every second", False
        if (n := _step(sec_token, 60)) is not None:
            return _every(n, "second"), False
        if len(seconds) == 1:
            return f"every minute at second {seconds[0]}", False
    if len(seconds) == 1 and schedule.fixed and len(schedule.minutes) * len(schedule.hours) <= _MAX_LISTED:
        times = [f"{h:02}:{m:02}:{seconds[0]:02}" for h in schedule.hours for m in schedule.minutes]
        return f"at {_join(times)}", True
    return None


def _minutes_phrase(schedule: _Schedule, minute: str, hour: str) -> tuple[str, bool] | None:
    """"every minute", "every 15 minutes": any hour."""
    if minute == "*" and hour == "*":
        return "every minute", False
    if hour == "*" and (n := _step(minute, 60)) is not None:
        return _every(n, "minute"), False
    return None


def _clock_times_phrase(schedule: _Schedule, minute: str, hour: str) -> tuple[str, bool] | None:
    """"every hour at :15", "every 2 hours at :15", "at 09:00 and 17:00": a short list of minutes."""
    minutes, hours = schedule.minutes, schedule.hours
    if "*" in minute or len(minutes) > _MAX_LISTED:
        return None
    at = _join([f":{m:02}" for m in minutes])
    if hour == "*":
        return f"every hour at {at}", False
    if (n := _step(hour, 24)) is not None:
        return f"{_every(n, 'hour')} at {at}", False
    if len(minutes) * len(hours) <= _MAX_LISTED:
        return f"at {_join([f'{h:02}:{m:02}' for h in hours for m in minutes])}", True
    span = _hour_span(schedule, hour)
    if span and len(minutes) == 1:
        return f"every hour from {span[0]:02}:{minutes[0]:02} to {span[1]:02}:{minutes[0]:02}", False
    return None


def _hour_span_phrase(schedule: _Schedule, minute: str, hour: str) -> tuple[str, bool] | None:
    """"every 15 minutes from 09:00 to 17:45": every minute, or a step of minutes, within a run of hours."""
    span = _hour_span(schedule, hour)
    if span and (minute == "*" or _step(minute, 60)):
        every = "every minute" if minute == "*" else _every(_step(minute, 60), "minute")
        return f"{every} from {span[0]:02}:00 to {span[1]:02}:{schedule.minutes[-1]:02}", False
    return None


def _day_phrases(schedule: _Schedule) -> list[str]:
    months = sorted(schedule.months)
    doms, dows = sorted(schedule.doms), schedule.dows
    both_must_match = schedule.dom_star or schedule.dow_star
    dom_restricted, dow_restricted = len(doms) < 31, len(dows) < 7
    if not both_must_match and not (dom_restricted and dow_restricted):
        # Either may match and one of them matches every day: every day it is.
        dom_restricted = dow_restricted = False
    if dom_restricted and dow_restricted and both_must_match:
        raise _Undescribable  # "*/2" with a weekday: odd-numbered days that are also Mondays
    parts = []
    if dom_restricted and not dow_restricted and len(doms) == 1 and len(months) == 1:
        return [f"on {doms[0]} {_MONTH_FULL[months[0]]}"]
    dom_phrase = None
    if dom_restricted:
        dom_phrase = f"on day{'s' if len(doms) > 1 else ''} {_join(_runs(doms, str))} of the month"
    if dow_restricted:
        # Monday first, Sunday last: "Saturday and Sunday" reads better than "Sunday and Saturday".
        iso = sorted((d - 1) % 7 for d in dows)
        dow_phrase = f"on {_join(_runs(iso, lambda i: _DOW_FULL[(i + 1) % 7]))}"
        parts.append(f"{dom_phrase} or {dow_phrase}" if dom_phrase else dow_phrase)
    elif dom_phrase:
        parts.append(dom_phrase)
    if len(months) < 12:
        parts.append(f"in {_join(_runs(months, lambda m: _MONTH_FULL[m]))}")
    return parts


def describe(expr: str) -> str:
    """The schedule in words, e.g. "every day at 02:30", "every hour at :00", "every 15 minutes",
    "at 09:00 on Monday to Friday", "every minute". Best effort: shapes it cannot put into words well come
    back as the (normalised) expression itself. Raises :class:`CronError` for an invalid expression."""
    schedule = _schedule(expr)
    try:
        time_phrase, clock_times = _time_phrase(schedule)
        days = _day_phrases(schedule)
    except _Undescribable:
        return schedule.expression
    if clock_times and not any(part.startswith("on ") for part in days):
        time_phrase = f"every day {time_phrase}"
    return " ".join([time_phrase, *days])
