"""UTC offset transitions of a time zone, and the segments of constant offset between them.

zoneinfo has no public way to list transitions, so they are found by probing the offset once a day and
bisecting to the second, once per zone and month (cached). Two changes that cancel out within one probe
interval would be missed: in the tz database the closest such pair is 3.99 days apart (Africa/Freetown,
1939). For every zone, the transitions found this way from 1850 to the end of the zone's table were
checked to be exactly those of its TZif file (tzdata 2025/2026); the tests check the closest pairs. The
zones of the Etc area and UTC's aliases have one offset by definition and are never probed.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

ONE_SECOND = timedelta(seconds=1)
_PROBE = timedelta(days=1)
# Fire times lie in [FIRST, LAST] (naive UTC): a day inside datetime's range, so that adding any zone's
# offset (under 16 hours, even in the local mean times of the 1800s) never leaves it.
FIRST = datetime(1, 1, 2)
LAST = datetime(9999, 12, 30)
# How many months segment_end looks ahead for a transition before settling for a month boundary where
# nothing changes: more than a year, so that a zone with DST always shows its next change.
_LOOKAHEAD_MONTHS = 13
_FIXED_ZONE_RE = re.compile(r"(Etc/)?(UTC|UCT|Universal|Zulu|Greenwich|GMT([+-][0-9]{1,2}|0)?)", re.ASCII)


def utc_offset(zone: ZoneInfo, instant: datetime) -> timedelta:
    # Clamped into [FIRST, LAST]: near datetime's ends the conversion to local time would overflow.
    instant = min(max(instant, FIRST), LAST)
    return instant.replace(tzinfo=UTC).astimezone(zone).utcoffset()


def _next_month(year: int, month: int) -> tuple[int, int]:
    return (year + 1, 1) if month == 12 else (year, month + 1)


def _month_start(year: int, month: int) -> datetime:
    return datetime(year, month, 1) if year <= 9999 else datetime.max


@lru_cache(maxsize=1024)
def _fixed_zone(zone_key: str) -> bool:
    return _FIXED_ZONE_RE.fullmatch(zone_key) is not None


@lru_cache(maxsize=16384)
def transitions_in_month(zone_key: str, year: int, month: int) -> tuple[datetime, ...]:
    """Naive UTC instants in (the 1st of the month, the 1st of the next month] at which the zone's UTC offset
    changes."""
    if _fixed_zone(zone_key):
        return ()
    zone = ZoneInfo(zone_key)
    t, end = _month_start(year, month), _month_start(*_next_month(year, month))
    off = utc_offset(zone, t)
    found = []
    while t < end:
        probe = t + min(_PROBE, end - t)
        if utc_offset(zone, probe) == off:
            t = probe
            continue
        lo, hi = 0, int((probe - t).total_seconds())
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if utc_offset(zone, t + timedelta(seconds=mid)) == off:
                lo = mid
            else:
                hi = mid
        t = t + timedelta(seconds=hi)
        off = utc_offset(zone, t)
        found.append(t)
    return tuple(found)


@lru_cache(maxsize=16384)
def first_transition_from(zone_key: str, year: int, month: int) -> datetime:
    """The first transition in this month or the next few, or, if there is none, the start of the month after
    those: a boundary at which the offset does not change (harmless: nothing happens there)."""
    for _ in range(_LOOKAHEAD_MONTHS):
        if year > 9999:
            return datetime.max
        found = transitions_in_month(zone_key, year, month)
        if found:
            return found[0]
        year, month = _next_month(year, month)
    return _month_start(year, month)


def segment_end(zone_key: str, instant: datetime) -> datetime:
    """The next transition after `instant` (see first_transition_from)."""
    if _fixed_zone(zone_key):
        return datetime.max
    for at in transitions_in_month(zone_key, instant.year, instant.month):
        if at > instant:
            return at
    return first_transition_from(zone_key, *_next_month(instant.year, instant.month))


def segment_start(zone_key: str, instant: datetime) -> datetime | None:
    # Only a transition within the last day matters (the repeated hour of a fall-back), so this month and
    # the one before are plenty; the one before also holds a transition at exactly midnight of the 1st.
    year, month = instant.year, instant.month
    for _ in range(2):
        if year < 1:
            break
        for at in reversed(transitions_in_month(zone_key, year, month)):
            if at <= instant:
                return at
        year, month = (year - 1, 12) if month == 1 else (year, month - 1)
    return None


def segment_at(zone: ZoneInfo, instant: datetime) -> tuple[datetime | None, timedelta, timedelta, datetime]:
    """(start, offset before start, offset, end) of the segment of constant offset that holds `instant`."""
    start = segment_start(zone.key, instant)
    off = utc_offset(zone, instant)
    before_off = off if start is None else utc_offset(zone, start - ONE_SECOND)
    return start, before_off, off, segment_end(zone.key, instant)

