"""The core: :func:`fire_times` and the functions built on it (next fire time, preview, validation).

A walk over the segments of constant UTC offset of the zone (``offsets.py``), matching wall times with
the parsed expression (``expression.py``) inside each, with Debian cron's DST rules applied where a
segment starts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from orchestrator.cron.expression import MONTH_FULL, ONE_DAY, Parsed, bad, join, parsed, time_zone
from orchestrator.cron.offsets import FIRST, LAST, ONE_SECOND, segment_at, segment_end, utc_offset

# Every search gives up after this long without a fire time, so nothing can hang. It is long because a
# valid schedule can be rare: "0 0 29 2 */7" (Feb 29 that is a Sunday) comes round every 28 years, and
# longer across 2100, which is not a leap year.
_HORIZON = timedelta(days=50 * 366)
# Where a schedule fires rarely (Feb 29), the walk jumps from a segment's end to a day before the next
# matching wall time instead of visiting every segment in between (two a year in most zones). Every fire
# time after the segment's end has a wall time at most _LOOK_BACK before the end's wall time (an offset
# changes by a day at most, Samoa in 2011, and offsets stay under 16 hours), and fires less than a day
# before its wall time, so the jump skips nothing.
_LOOK_BACK = timedelta(days=3)


def _later(instant: datetime, delta: timedelta) -> datetime:
    """instant + delta, but never past LAST (and so never past datetime.max)."""
    return LAST if instant >= LAST - delta else instant + delta


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


def _candidates(schedule: Parsed, zone: ZoneInfo, after: datetime, until: datetime | None) -> Iterator[datetime]:
    """Naive UTC fire instants after `after`, non-decreasing (a gap can produce the same instant twice).

    Time is cut into segments of constant UTC offset. Inside one, wall time and UTC move in lockstep, so
    matching wall times convert to UTC by one subtraction and stay ordered. Wall times inside a
    spring-forward gap belong to no segment and those of a repeated hour to two, which is exactly "follow
    real elapsed time"; the fixed-time exceptions are applied where a segment starts.
    """
    deadline = _later(after, _HORIZON)
    while after < _stop(deadline, until):
        # Enter the segment that holds `after`: at the start, and again after each jump.
        start, before_off, off, end = segment_at(zone, after)
        lo = (after + off).replace(microsecond=0) + ONE_SECOND
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
            while (wall := schedule.next_match(lo, min(end, _stop(deadline, until) + ONE_SECOND) + off)) is not None:
                yield wall - off
                deadline = _later(wall - off, _HORIZON)
                lo = wall + ONE_SECOND
            stop = _stop(deadline, until)
            if end > stop:
                return
            ahead = schedule.next_match(end + off - _LOOK_BACK, stop + ONE_DAY)
            if ahead is None:
                return  # no wall time matches before the horizon or `until`: nothing more fires
            if ahead - ONE_DAY > end:
                after = ahead - ONE_DAY
                break  # jump over the segments in between
            start, before_off, off, end = end, off, utc_offset(zone, end), segment_end(zone.key, end)
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
    DST rules of the package docstring.

    Arguments are checked when called, not when iteration starts. An expression that can never fire
    (``0 0 30 2 *``) yields nothing; every search is bounded, so nothing hangs.
    """
    schedule = parsed(expr)
    zone = time_zone(timezone)
    # Outside [FIRST, LAST] nothing fires; clamping keeps the arithmetic inside datetime's range.
    after_utc = max(_naive_utc(after, "after"), FIRST - ONE_SECOND)
    until_utc = None if until is None else min(_naive_utc(until, "until"), LAST)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a whole number, 0 or more, or None, got {limit!r}")
    return _fire_times(schedule, zone, after_utc, until_utc, limit)


def _fire_times(
    schedule: Parsed, zone: ZoneInfo, after: datetime, until: datetime | None, limit: int | None
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
    zone = time_zone(timezone)
    return [(at, at.astimezone(zone)) for at in fires]


def validate(expr: str, timezone: str) -> None:
    """Raise :class:`CronError` for a bad expression or timezone, else return None.

    Stricter than :func:`fire_times` in one way: it also rejects expressions that can never fire, such as
    ``0 0 30 2 *``, because saving one is always a mistake; fire_times just yields nothing for them.
    """
    schedule = parsed(expr)
    time_zone(timezone)
    if schedule.never:
        days = join([str(d) for d in sorted(schedule.doms)], "or")
        months = join([MONTH_FULL[m] for m in sorted(schedule.months)], "or")
        raise bad(expr, f"it can never fire: day {days} does not occur in {months}")


def is_fixed_time(expr: str) -> bool:
    """True when neither the minute nor the hour field contains ``*`` (after alias expansion): such a job
    runs once after a spring-forward gap and once in a repeated hour. A seconds field does not matter."""
    return parsed(expr).fixed


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


