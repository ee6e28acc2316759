"""All cron arithmetic of the orchestrator, behind one core function: :func:`fire_times`.

The scheduler, backfills, UI previews and validation all go through this module so that every part of the
product agrees on what a schedule means. It deliberately imports nothing from Django.

Expressions
-----------
* Five fields: ``minute hour day-of-month month day-of-week``. Each field takes ``*``, numbers, names
  (``JAN``-``DEC`` in the month field, ``SUN``-``SAT`` in the day-of-week field, any case), ranges ``a-b``,
  lists ``a,b,c`` and steps ``*/n``, ``a-b/n`` or ``a/n`` (from a to the end of the field). Day of week 0
  and 7 are both Sunday. A range whose start is above its end wraps around (``FRI-MON``, ``22-2``).
* Six fields: an optional **seconds field first**: ``*/10 * * * * *`` fires every 10 seconds and
  ``30 0 3 * * *`` at 03:00:30 every day.
* Aliases: ``@hourly`` ``@daily`` ``@midnight`` ``@weekly`` ``@monthly`` ``@yearly`` ``@annually``.
* Runs of whitespace are normalised. Anything else (``@reboot``, seven fields, the croniter extensions
  ``L``, ``W``, ``#``, ``?`` and ``H``, out-of-range values, non-strings) is rejected with a
  :class:`CronError`.
* Days, as in Vixie/Debian cron: if the day-of-month or the day-of-week field starts with ``*``, a day must
  match both; otherwise it may match either (``0 0 1,15 * MON`` is the 1st, the 15th and every Monday, while
  ``0 0 */2 * MON`` is the odd-numbered days that are Mondays).

croniter is not used at run time: it reads an equal range such as ``5-5`` as the whole field (so
``0 5-5 * * *`` would fire hourly), its error messages do not say which value is wrong, and a get_next()
costs tens of microseconds, too slow for the scheduler's every-schedule sweeps. For the forms above the
value sets agree with croniter's (the tests compare them), except equal ranges and the day rule, where this
module follows cron (croniter's default treats ``*/2`` with a weekday as "either").

Time zones and daylight saving time (Debian cron's rules)
---------------------------------------------------------
Matching happens on the wall clock of the schedule's IANA time zone; results are UTC instants.

* A *fixed-time* job has no ``*`` in its minute field and none in its hour field (``@daily`` is one,
  ``@hourly`` and ``*/15 3 * * *`` are not); see :func:`is_fixed_time`.
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
                d = date(d.year + 1, 1, 1) if d.month == 12 else date(d.year, d.month + 1, 1)
                tod = None
                continue
            if self._day_matches(d):
                found = self._time_at_or_after(*tod) if tod else (self.hours[0], self.minutes[0], self.seconds[0])
                if found is not None:
                    candidate = datetime(d.year, d.month, d.day, *found)
                    return candidate if candidate < hi else None
            d += _ONE_DAY
            tod = None
        return None


def _bad(expr: object, why: str) -> CronError:
    shown = f"'{expr}'" if isinstance(expr, str) else repr(expr)
    return CronError(f"invalid cron expression {shown}: {why}")


def _parse_value(expr: str, spec: _FieldSpec, text: str) -> int:
    if _DIGITS_RE.fullmatch(text):
        value = int(text)
    elif text.lower() in spec.names:
        return spec.names[text.lower()]
    elif spec.names:
        raise _bad(expr, f"{spec.name} field name '{text}' is not recognised{spec.names_hint}")
    else:
        raise _bad(expr, f"{spec.name} field value '{text}' is not a number")
    if not spec.low <= value <= spec.high:
        raise _bad(expr, f"{spec.name} field value {value} is out of range {spec.low}-{spec.high}")
    return value


def _expand_item(expr: str, spec: _FieldSpec, field: str, item: str) -> set[int]:
    if not item:
        raise _bad(expr, f"{spec.name} field '{field}' has an empty list item")
    match = _TOKEN_RE.fullmatch(item) if item.isascii() else None
    if match is None or (match["start"] == "*" and match["end"] is not None):
        raise _bad(expr, f"{spec.name} field item '{item}' is not a number, name, range, list or step")
    start, end, step_text = match.group("start", "end", "step")
    step = 1
    if step_text is not None:
        if not _DIGITS_RE.fullmatch(step_text):
            raise _bad(expr, f"{spec.name} field step '{step_text}' is not a number")
        step = int(step_text)
        if step < 1:
            raise _bad(expr, f"{spec.name} field step {step_text} must be at least 1")
    # Day of week 7 is another Sunday: it may end a range (0-7, 5-7) but never extends a cycle.
    top = 6 if spec is _DOW else spec.high
    if start == "*":
        low, high = spec.low, top
    else:
        low = _parse_value(expr, spec, start)
        if end is not None:
            high = _parse_value(expr, spec, end)
        else:
            high = top if step_text is not None else low  # "a/n" runs from a to the end of the field
    if spec is _DOW and low > high:
        low, high = low % 7, high % 7
    if low <= high:
        values = list(range(low, high + 1, step))
    else:
        # A reversed range wraps around the end of the field (22-2, FRI-MON), as croniter reads it.
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
    normalised = " ".join(expr.split())
    if not normalised:
        raise _bad(expr, "it is empty")
    body = normalised
    if normalised.startswith("@"):
        body = _ALIASES.get(normalised.lower(), "")
        if not body:
            raise _bad(expr, f"{normalised} is not supported (use one of {', '.join(_ALIASES)})")
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
        fixed="*" not in minute and "*" not in hour,
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
    shown = f"'{name}'" if isinstance(name, str) else repr(name)
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
# zoneinfo has no public way to list transitions, so they are found by probing the offset every few hours
# and bisecting to the second, once per zone and year (cached). Two changes that cancel out within one probe
# interval would be missed; in the tz database no two offset changes of a zone are less than ~4 days apart.

_ONE_SECOND = timedelta(seconds=1)
_ONE_DAY = timedelta(days=1)
_PROBE = timedelta(hours=6)
# Every search gives up after this long without a fire time, so nothing can hang. It is long because a
# valid schedule can be rare: "0 0 29 2 */7" (Feb 29 that is a Sunday) comes round every 28 years, and
# longer across 2100, which is not a leap year.
_HORIZON = timedelta(days=50 * 366)
_LAST = datetime(9000, 1, 1)  # keeps the horizon arithmetic away from datetime.max


def _offset(zone: ZoneInfo, instant: datetime) -> timedelta:
    return instant.replace(tzinfo=UTC).astimezone(zone).utcoffset()


@lru_cache(maxsize=8192)
def _transitions_in_year(zone_key: str, year: int) -> tuple[datetime, ...]:
    """Naive UTC instants in (Jan 1 `year`, Jan 1 `year` + 1] at which the zone's UTC offset changes."""
    zone = ZoneInfo(zone_key)
    t, end = datetime(year, 1, 1), datetime(year + 1, 1, 1)
    off = _offset(zone, t)
    found = []
    while t < end:
        probe = min(t + _PROBE, end)
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


def _segment_end(zone_key: str, instant: datetime) -> datetime:
    """The next transition after `instant`, or, if there is none within two calendar years, a boundary
    at which the offset does not change (harmless, and it keeps zones without DST from scanning far)."""
    for year in (instant.year, instant.year + 1):
        for at in _transitions_in_year(zone_key, year):
            if at > instant:
                return at
    return datetime(instant.year + 2, 1, 1)


def _segment_start(zone_key: str, instant: datetime) -> datetime | None:
    # One year back is plenty: only a transition within the last few hours matters (the repeated hour of
    # a fall-back), and looking at the previous year also catches one at exactly midnight of January 1.
    for year in (instant.year, instant.year - 1):
        for at in reversed(_transitions_in_year(zone_key, year)):
            if at <= instant:
                return at
    return None


# ---------------------------------------------------------------------------------------------------------
# The core


def _naive_utc(value: object, name: str) -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got naive {value.isoformat()}")
    return value.astimezone(UTC).replace(tzinfo=None)


def _candidates(schedule: _Schedule, zone: ZoneInfo, after: datetime, until: datetime | None) -> Iterator[datetime]:
    """Naive UTC fire instants after `after`, non-decreasing (a gap can produce the same instant twice).

    Time is cut into segments of constant UTC offset. Inside one, wall time and UTC move in lockstep, so
    matching wall times convert to UTC by one subtraction and stay ordered. Wall times inside a
    spring-forward gap belong to no segment and those of a repeated hour to two, which is exactly "follow
    real elapsed time"; the fixed-time exceptions are applied where a segment starts.
    """
    if after >= _LAST:
        return
    key = zone.key
    start = _segment_start(key, after)
    before_off = off = _offset(zone, after)
    if start is not None:
        before_off = _offset(zone, start - _ONE_SECOND)
    end = _segment_end(key, after)
    deadline = after + _HORIZON
    lo = (after + off).replace(microsecond=0) + _ONE_SECOND
    entered_at_start = False
    while True:
        if entered_at_start:
            lo = start + off
            if schedule.fixed and off > before_off and schedule.next_match(start + before_off, lo) is not None:
                # Debian cron: a fixed-time job whose wall time was skipped runs once, right after the gap.
                yield start
                deadline = min(start + _HORIZON, _LAST)
        if schedule.fixed and start is not None and before_off > off:
            # The repeated wall times already had their turn in the first occurrence (or, with `after`
            # inside the second one, are in the past): a fixed-time job must not run a second time.
            lo = max(lo, start + before_off)
        while True:
            bound = min(end, deadline) if until is None else min(end, deadline, until + _ONE_SECOND)
            wall = schedule.next_match(lo, bound + off)
            if wall is None:
                break
            instant = wall - off
            yield instant
            deadline = min(instant + _HORIZON, _LAST)
            lo = wall + _ONE_SECOND
        if end > deadline or (until is not None and end > until):
            return
        start, before_off = end, off
        off = _offset(zone, start)
        end = _segment_end(key, start)
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
    after_utc = _naive_utc(after, "after")
    until_utc = None if until is None else _naive_utc(until, "until")
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
    seconds, minutes, hours = schedule.seconds, schedule.minutes, schedule.hours
    plain_seconds = sec_token is None or seconds == (0,)
    if not plain_seconds:
        if minute == "*" and hour == "*":
            if sec_token == "*":
                return "every second", False
            if (n := _step(sec_token, 60)) is not None:
                return _every(n, "second"), False
            if len(seconds) == 1:
                return f"every minute at second {seconds[0]}", False
        if len(seconds) == 1 and schedule.fixed and len(minutes) * len(hours) <= _MAX_LISTED:
            times = [f"{h:02}:{m:02}:{seconds[0]:02}" for h in hours for m in minutes]
            return f"at {_join(times)}", True
        raise _Undescribable

    if minute == "*" and hour == "*":
        return "every minute", False
    if hour == "*" and (n := _step(minute, 60)) is not None:
        return _every(n, "minute"), False
    if "*" not in minute and len(minutes) <= _MAX_LISTED:
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
    span = _hour_span(schedule, hour)
    if span and (minute == "*" or _step(minute, 60)):
        every = "every minute" if minute == "*" else _every(_step(minute, 60), "minute")
        return f"{every} from {span[0]:02}:00 to {span[1]:02}:{minutes[-1]:02}", False
    raise _Undescribable


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
