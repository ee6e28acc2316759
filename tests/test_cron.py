"""Scenarios for orchestrator/cron/: parsing, aliases, the seconds field, Debian cron's DST rules in both
hemispheres, bounds, jitter and descriptions. Pure Python: no Django, no sleeps."""

import calendar
import contextlib
import hashlib
import itertools
import os
import re
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from orchestrator import cron
from orchestrator.cron import CronError, offsets

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


def local(zone: str, *args, fold: int = 0) -> datetime:
    """A wall time in `zone` as a UTC instant; fold=1 picks the second occurrence of a repeated time."""
    return datetime(*args, tzinfo=ZoneInfo(zone), fold=fold).astimezone(UTC)


def take(expr, zone, after, n):
    return list(cron.fire_times(expr, zone, after, limit=n))


def transition_on(zone: str, day: date) -> tuple[datetime, timedelta, timedelta]:
    """The UTC instant during local `day` at which `zone` changes its offset, found minute by minute with
    zoneinfo alone, so the DST tests do not rest on dates copied from a calendar (or on the code under
    test)."""
    tz = ZoneInfo(zone)
    t = datetime(day.year, day.month, day.day, tzinfo=tz).astimezone(UTC)
    before = t.astimezone(tz).utcoffset()
    for _ in range(26 * 60):
        t += timedelta(minutes=1)
        after = t.astimezone(tz).utcoffset()
        if after != before:
            return t, before, after
    raise AssertionError(f"{zone} does not change its UTC offset on {day}")


# One spring-forward and one fall-back per hemisphere, 2026.
SPRING_FORWARD = [("Europe/Berlin", date(2026, 3, 29)), ("Australia/Sydney", date(2026, 10, 4))]
FALL_BACK = [("Europe/Berlin", date(2026, 10, 25)), ("Australia/Sydney", date(2026, 4, 5))]
BOTH = SPRING_FORWARD + FALL_BACK


@pytest.fixture(params=SPRING_FORWARD, ids=lambda case: case[0])
def gap(request):
    """(zone, transition instant, wall time where the gap starts, wall time where it ends)."""
    zone, day = request.param
    at, before, after = transition_on(zone, day)
    assert after - before == HOUR, "a one-hour spring-forward gap"
    return zone, at, (at + before).replace(tzinfo=None), (at + after).replace(tzinfo=None)


@pytest.fixture(params=FALL_BACK, ids=lambda case: case[0])
def repeat(request):
    """(zone, transition instant, wall time where the repeated hour starts)."""
    zone, day = request.param
    at, before, after = transition_on(zone, day)
    assert before - after == HOUR, "a one-hour fall-back"
    return zone, at, (at + after).replace(tzinfo=None)


def hourly_transitions(zone: str, year: int, month: int) -> list[datetime]:
    """Offset changes in a month found hour by hour, then to the second (independent of orchestrator.cron)."""
    tz = ZoneInfo(zone)
    t = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    found = []
    while t < end:
        nxt = t + HOUR
        if nxt.astimezone(tz).utcoffset() != t.astimezone(tz).utcoffset():
            s = t
            while s.astimezone(tz).utcoffset() == t.astimezone(tz).utcoffset():
                s += timedelta(seconds=1)
            found.append(s.replace(tzinfo=None))
        t = nxt
    return found


@pytest.mark.parametrize(("zone", "year", "month"), [
    ("Africa/Freetown", 1939, 9),  # there and back within four days
    ("America/Recife", 2000, 10),  # a week of summer time
    ("Asia/Gaza", 2040, 10),  # the rules of the 2040s: a week apart
    ("Pacific/Apia", 2011, 12),  # a whole day skipped
    ("Europe/Berlin", 2026, 3), ("Australia/Lord_Howe", 2026, 10),  # a half-hour change
])
def test_offset_changes_close_together_are_all_found(zone, year, month):
    # Offsets are probed once a day; these are the tz database's closest pairs of changes.
    expected = hourly_transitions(zone, year, month)
    assert expected, "a month with a change"
    assert list(offsets.transitions_in_month(zone, year, month)) == expected


def test_the_dst_dates_used_here_are_the_real_ones():
    # Guard against a tzdata change or a typo in the tables above: what the zones really do in 2026.
    assert transition_on("Europe/Berlin", date(2026, 3, 29))[0] == utc(2026, 3, 29, 1)
    assert transition_on("Europe/Berlin", date(2026, 10, 25))[0] == utc(2026, 10, 25, 1)
    assert transition_on("Australia/Sydney", date(2026, 4, 5))[0] == utc(2026, 4, 4, 16)
    assert transition_on("Australia/Sydney", date(2026, 10, 4))[0] == utc(2026, 10, 3, 16)


# --- validation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("61 * * * *", "minute field value 61 is out of range 0-59"),
        ("* 24 * * *", "hour field value 24 is out of range 0-23"),
        ("* * 0 * *", "day-of-month field value 0 is out of range 1-31"),
        ("* * 32 * *", "day-of-month field value 32"),
        ("* * * 13 *", "month field value 13 is out of range 1-12"),
        ("* * * * 8", "day-of-week field value 8 is out of range 0-7"),
        ("60 * * * * *", "second field value 60 is out of range 0-59"),
        ("* * * * FOO", "'FOO'"),
        ("0 0 * MON *", "month field name 'MON'"),
        ("*/0 * * * *", "step 0"),
        ("*/x * * * *", "step 'x'"),
        ("1,,2 * * * *", "'1,,2'"),
        ("5-1-2 * * * *", "'5-1-2'"),
        ("banana * * * *", "'banana'"),
        ("@reboot", "@reboot"),
        ("@fortnightly", "@fortnightly"),
        ("1 2 3 4 5 6 7", "got 7"),
        ("* * * *", "got 4"),
        ("", "''"),
        ("   ", "empty"),
        # croniter extensions we do not promise to support
        ("0 0 L * *", "'L'"),
        ("0 0 * * 1#2", "'1#2'"),
        ("H * * * *", "'H'"),
        ("0 0 ? * MON", "'?'"),
    ],
)
def test_bad_expression_is_rejected_with_a_message_naming_the_bad_value(expr, fragment):
    with pytest.raises(CronError) as excinfo:
        cron.validate(expr, "UTC")
    message = str(excinfo.value)
    assert fragment in message
    assert f"'{expr}'" in message
    # sync.py blames the timezone field when the message mentions it; it must not for a bad expression.
    assert "timezone" not in message


@pytest.mark.parametrize("expr", ["1" * 5000 + " * * * *", "9" * 900 + " * * * *", "*/" + "9" * 900 + " * * * *",
                                  "0 0 * * " + "7" * 4400, "* " * 400 + "*", "@" + "x" * 3000])
def test_a_huge_expression_is_a_cron_error_whose_message_quotes_only_its_start(expr):
    # int() of more than 4,300 digits raises its own ValueError; the message must still be ours, and short.
    with pytest.raises(CronError) as excinfo:
        cron.validate(expr, "UTC")
    message = str(excinfo.value)
    assert message.startswith("invalid cron expression '")
    assert len(message) < 400, message
    assert "characters" in message  # says how long the input was instead of quoting it all


def test_a_huge_timezone_name_is_quoted_only_in_part():
    with pytest.raises(CronError, match=r"^unknown timezone 'x{80}\.\.\.' \(5,000 characters\)$"):
        cron.validate("* * * * *", "x" * 5000)


def test_error_message_matches_the_documented_example():
    with pytest.raises(CronError, match=r"^invalid cron expression '61 \* \* \* \*': minute field value 61 is "
                       r"out of range 0-59$"):
        cron.validate("61 * * * *", "UTC")


@pytest.mark.parametrize("expr", [None, 42, ["0", "*", "*", "*", "*"], b"* * * * *"])
def test_non_string_expression_is_a_cron_error(expr):
    with pytest.raises(CronError, match=re.escape(repr(expr))):
        cron.validate(expr, "UTC")


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "Europe", "../etc/passwd", "/etc/localtime", "utc",
                                  "Europe/Berlin ", "localtime"])
def test_unknown_timezone_is_rejected_naming_it(zone):
    # "localtime" exists on most hosts but means whatever the host is set to: not a schedule's timezone.
    with pytest.raises(CronError, match=f"^{re.escape(f'unknown timezone {zone!r}')}$"):
        cron.validate("* * * * *", zone)


def test_non_string_timezone_is_rejected():
    with pytest.raises(CronError, match="unknown timezone None"):
        cron.fire_times("* * * * *", None, utc(2026, 1, 1))


def test_cron_error_is_a_value_error():
    assert issubclass(CronError, ValueError)


@pytest.mark.parametrize(
    "expr",
    ["* * * * *", "0 9 * * mon-fri", "0 9 * * MON-FRI", "*/15 9-17 * JAN,jul *", "0 0 * * 7", "0 0 * * 0-7",
     "0 22-2 * * FRI-MON", "5/15 * * * *", "@DAILY", "@annually", "*/10 * * * * *", " 0   9\t* * * "],
)
def test_well_formed_expressions_validate(expr):
    assert cron.validate(expr, "Europe/Berlin") is None


def test_schedule_that_can_never_fire_is_invalid_but_fire_times_just_yields_nothing():
    # Saving Feb 30 is always a mistake; a scheduler that meets one anyway (say, from old data) must not
    # hang or crash, just never fire it.
    with pytest.raises(CronError, match=r"'0 0 30 2 \*'.*never fire.*day 30 does not occur in February"):
        cron.validate("0 0 30 2 *", "UTC")
    started = time.perf_counter()
    assert list(cron.fire_times("0 0 30 2 *", "UTC", utc(2026, 1, 1))) == []
    assert list(cron.fire_times("0 0 31 4,6,9,11 *", "Europe/Berlin", utc(2026, 1, 1))) == []
    assert cron.next_fire_time("0 0 30 2 *", "UTC", utc(2026, 1, 1)) is None
    assert time.perf_counter() - started < 1


def test_feb_30_with_a_weekday_is_valid_because_either_day_field_may_match():
    # Neither day field starts with "*", so Mondays in February match even though Feb 30 never comes.
    cron.validate("0 0 30 2 MON", "UTC")
    assert cron.next_fire_time("0 0 30 2 MON", "UTC", utc(2026, 1, 1)) == utc(2026, 2, 2)


def test_arguments_are_checked_when_fire_times_is_called_not_when_iterated():
    with pytest.raises(CronError):
        cron.fire_times("nope", "UTC", utc(2026, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        cron.fire_times("* * * * *", "UTC", datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        cron.fire_times("* * * * *", "UTC", utc(2026, 1, 1), until=datetime(2026, 1, 2))
    with pytest.raises(ValueError, match="limit"):
        cron.fire_times("* * * * *", "UTC", utc(2026, 1, 1), limit=-1)


# --- fields, aliases, the seconds field -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alias", "expansion"),
    [("@yearly", "0 0 1 1 *"), ("@annually", "0 0 1 1 *"), ("@monthly", "0 0 1 * *"), ("@weekly", "0 0 * * 0"),
     ("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"), ("@hourly", "0 * * * *"), ("@Daily", "0 0 * * *")],
)
def test_alias_fires_exactly_like_its_expansion(alias, expansion):
    after = utc(2026, 2, 27, 13, 7)
    assert take(alias, "Europe/Berlin", after, 5) == take(expansion, "Europe/Berlin", after, 5)
    assert cron.is_fixed_time(alias) == cron.is_fixed_time(expansion)


def test_whitespace_is_normalised():
    after = utc(2026, 1, 1)
    assert take("  0\t9  * *   *\n", "UTC", after, 3) == take("0 9 * * *", "UTC", after, 3)


def test_six_fields_put_the_seconds_first():
    fires = take("*/10 * * * * *", "UTC", utc(2026, 1, 1, 12, 0, 5), 4)
    assert fires == [utc(2026, 1, 1, 12, 0, s) for s in (10, 20, 30, 40)]
    # 03:00:30 every day, not "minute 30 of hour 0 on the 3rd" as a trailing seconds field would read it.
    assert take("30 0 3 * * *", "UTC", utc(2026, 1, 1), 2) == [utc(2026, 1, 1, 3, 0, 30), utc(2026, 1, 2, 3, 0, 30)]


def test_a_leading_zero_seconds_field_is_the_same_as_five_fields():
    after = utc(2026, 1, 1)
    assert take("0 */15 * * * *", "UTC", after, 6) == take("*/15 * * * *", "UTC", after, 6)


def test_names_are_case_insensitive_and_sunday_is_both_0_and_7():
    after = utc(2026, 1, 1)  # a Thursday
    expected = take("0 12 * * 0,6", "UTC", after, 6)
    assert [d.weekday() for d in expected] == [5, 6] * 3
    for spelling in ("0 12 * * sat,sun", "0 12 * * SAT-SUN", "0 12 * * 6-7", "0 12 * * 6,7", "0 12 * * Sat,7"):
        assert take(spelling, "UTC", after, 6) == expected, spelling


def test_equal_range_means_that_one_value_as_in_cron():
    # croniter reads "5-5" as the whole field and would fire hourly; cron means 05:00.
    assert croniter.expand("0 5-5 * * *")[0][1] == ["*"]
    assert take("0 5-5 * * *", "UTC", utc(2026, 1, 1), 2) == [utc(2026, 1, 1, 5), utc(2026, 1, 2, 5)]
    assert take("0 0 * * 7-7", "UTC", utc(2026, 1, 1), 1)[0].weekday() == 6


def test_reversed_range_wraps_around_midnight():
    fires = take("0 22-2 * * *", "UTC", utc(2026, 1, 1, 12), 5)
    assert [f.hour for f in fires] == [22, 23, 0, 1, 2]


def test_start_with_step_runs_to_the_end_of_the_field():
    assert [f.minute for f in take("5/20 * * * *", "UTC", utc(2026, 1, 1), 3)] == [5, 25, 45]


def weekdays(expr: str) -> set[str]:
    """The weekdays a day-of-week expression fires on over four weeks."""
    return {f.strftime("%a") for f in take(expr, "UTC", utc(2026, 1, 1), 28)}


def test_day_of_week_7_with_a_step_is_sunday_alone_as_cron_reads_it():
    # The field runs 0-7, so "7/2" is 7 to 7: Sunday. croniter reads it as every other day from Sunday.
    assert weekdays("0 0 * * 7/2") == {"Sun"}
    assert croniter.expand("0 0 * * 7/2")[0][4] == [0, 2, 4, 6]  # what croniter gets wrong
    assert weekdays("0 0 * * SUN/3") == {"Sun", "Wed", "Sat"}  # 0/3: from Sunday 0
    # "a/n" runs to 7, the end of the field, so Sunday comes round again where the step lands on 7.
    assert weekdays("0 0 * * 1/2") == {"Mon", "Wed", "Fri", "Sun"}
    assert weekdays("0 0 * * 5/1") == {"Fri", "Sat", "Sun"}
    assert weekdays("0 0 * * */2") == {"Sun", "Tue", "Thu", "Sat"}


def test_a_reversed_range_with_a_step_keeps_counting_across_the_wrap():
    # :50, :57, then seven minutes later :04 (croniter is one off after the wrap and gives :05).
    assert [f.minute for f in take("50-10/7 * * * *", "UTC", utc(2026, 1, 1, 0, 40), 3)] == [50, 57, 4]
    assert sorted(croniter.expand("50-10/7 * * * *")[0][0]) == [5, 50, 57]
    assert [f.hour for f in take("0 22-2/3 * * *", "UTC", utc(2026, 1, 1, 12), 2)] == [22, 1]


def test_either_day_field_may_match_when_neither_starts_with_a_star():
    fires = take("0 0 1,15 * MON", "UTC", utc(2026, 5, 31), 5)
    # June 2026: Mon 1st (both), Mon 8th, Mon 15th (both), Mon 22nd, Mon 29th ... and July 1st.
    assert fires == [utc(2026, 6, d) for d in (1, 8, 15, 22, 29)]
    assert take("0 0 1,15 * MON", "UTC", utc(2026, 6, 29, 1), 1) == [utc(2026, 7, 1)]


def test_a_starred_day_field_makes_both_day_fields_required_as_in_debian_cron():
    # Vixie/Debian cron: "*/2" starts with "*", so the day must be odd AND a Monday.
    fires = take("0 0 */2 * MON", "UTC", utc(2026, 6, 1, 1), 4)
    assert all(f.weekday() == 0 and f.day % 2 == 1 for f in fires)
    assert fires[0] == utc(2026, 6, 15)


@pytest.mark.parametrize(
    ("expr", "second_at_beginning"),
    [("*/15 * * * *", False), ("0 9 * * 1-5", False), ("30 2 1,15 * *", False), ("0 0 * JAN-MAR SUN", False),
     ("5-10/2 22-2 * * *", False), ("0 0 1 1 *", False), ("0 12 * * SAT-SUN", False), ("0 0 1,15 * MON", False),
     ("0 0 29 2 *", False), ("*/10 * * * * *", True), ("15 30 4 * * 1-5", True), ("0 0 * * 0-7", False)],
)
def test_value_sets_agree_with_croniter_for_the_common_forms(expr, second_at_beginning):
    # In UTC, where croniter has no DST logic to differ on, both must give the same instants.
    start = datetime(2026, 1, 1, 0, 0, 1)
    it = croniter(expr, start, second_at_beginning=second_at_beginning)
    theirs = [it.get_next(datetime).replace(tzinfo=UTC) for _ in range(40)]
    assert take(expr, "UTC", start.replace(tzinfo=UTC), 40) == theirs


@pytest.mark.parametrize(
    ("expr", "fixed"),
    [("30 2 * * *", True), ("@daily", True), ("@midnight", True), ("@weekly", True), ("@yearly", True),
     ("0,30 2 * * *", True), ("0 9-17 * * *", True), ("@hourly", False), ("0 * * * *", False),
     ("*/15 3 * * *", False), ("0 */2 * * *", False), ("* * * * *", False),
     # Debian cron reads the first character only (entry.c sets MIN_STAR/HR_STAR on a leading "*")
     ("52,*/45 2 * * *", True), ("0 3,*/6 * * *", True), ("*/45,52 2 * * *", False), ("0 */6,3 * * *", False),
     # the seconds field does not count
     ("*/10 30 2 * * *", True), ("0 * 2 * * *", False)],
)
def test_fixed_time_classification(expr, fixed):
    assert cron.is_fixed_time(expr) is fixed


# --- the basics of fire_times ---------------------------------------------------------------------------


def test_results_are_aware_utc_strictly_after_after_in_increasing_order():
    after = utc(2026, 1, 1, 9)
    fires = take("0 9,21 * * *", "UTC", after, 4)
    assert fires == [utc(2026, 1, 1, 21), utc(2026, 1, 2, 9), utc(2026, 1, 2, 21), utc(2026, 1, 3, 9)]
    assert all(f.tzinfo is UTC for f in fires)


def test_after_with_microseconds_past_a_fire_time_skips_it():
    assert cron.next_fire_time("0 9 * * *", "UTC", utc(2026, 1, 1, 9, 0, 0, 1)) == utc(2026, 1, 2, 9)


def test_after_in_any_timezone_means_the_same_instant():
    tokyo = datetime(2026, 1, 1, 18, 0, tzinfo=ZoneInfo("Asia/Tokyo"))  # 09:00 UTC
    assert take("*/30 * * * *", "Europe/Berlin", tokyo, 3) == take("*/30 * * * *", "Europe/Berlin", utc(2026, 1, 1, 9), 3)


def test_until_is_inclusive_and_limit_caps_the_count():
    after = utc(2026, 1, 1)
    assert list(cron.fire_times("0 * * * *", "UTC", after, until=utc(2026, 1, 1, 3))) == [
        utc(2026, 1, 1, 1), utc(2026, 1, 1, 2), utc(2026, 1, 1, 3)]
    assert len(list(cron.fire_times("* * * * *", "UTC", after, limit=7))) == 7
    assert len(list(cron.fire_times("* * * * *", "UTC", after, until=utc(2026, 1, 2), limit=7))) == 7
    assert list(cron.fire_times("* * * * *", "UTC", after, limit=0)) == []
    assert list(cron.fire_times("* * * * *", "UTC", after, until=after)) == []
    assert list(cron.fire_times("* * * * *", "UTC", after, until=after - DAY)) == []


def test_until_far_before_a_rare_schedule_stops_quickly():
    started = time.perf_counter()
    assert list(cron.fire_times("0 0 29 2 *", "Europe/Berlin", utc(2026, 3, 1), until=utc(2026, 3, 2))) == []
    assert time.perf_counter() - started < 0.5


def test_rare_schedules_are_found_years_ahead():
    assert cron.next_fire_time("0 0 29 2 *", "UTC", utc(2026, 1, 1)) == utc(2028, 2, 29)
    # Feb 29 that is also a Sunday ("*/7" starts with "*", so both day fields must match): every 28 years.
    assert take("0 0 29 2 */7", "UTC", utc(2026, 1, 1), 2) == [utc(2032, 2, 29), utc(2060, 2, 29)]


def test_fire_times_stay_correct_up_to_the_year_9999():
    # Every Feb 29 from 2000 to 9996, as croniter (the oracle here: no DST in UTC) lists them.
    it = croniter("0 0 29 2 *", datetime(2000, 1, 1))
    theirs = []
    with contextlib.suppress(ValueError):  # croniter ends with "year 10000 is out of range"
        while True:
            theirs.append(it.get_next(datetime).replace(tzinfo=UTC))
    ours = list(cron.fire_times("0 0 29 2 *", "UTC", utc(2000, 1, 1), until=utc(9999, 12, 31)))
    assert len(ours) == 1940
    assert ours == theirs


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "Pacific/Kiritimati", "Etc/GMT+12"])
def test_the_ends_of_the_calendar_give_no_overflow_only_fewer_fire_times(zone):
    first = datetime(1, 1, 1, tzinfo=UTC)
    last = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    early = take("0 0 * * *", zone, first, 3)
    assert len(early) == 3 and all(f.year == 1 for f in early)
    assert take("0 0 * * *", zone, last - 5 * DAY, 10)[-1] <= utc(9999, 12, 30)
    assert take("* * * * *", zone, last, 1) == []
    # Aware bounds beyond the calendar's ends in UTC (Tokyo's year 1 starts in UTC's year 0).
    new_years = cron.fire_times("0 0 1 1 *", zone, datetime(1, 1, 1, tzinfo=ZoneInfo("Asia/Tokyo")),
                                until=datetime(9999, 12, 31, 12, tzinfo=ZoneInfo("America/New_York")))
    assert [f.astimezone(ZoneInfo(zone)).date() for f in itertools.islice(new_years, 2)] == [date(2, 1, 1), date(3, 1, 1)]
    assert cron.next_fire_time("0 0 29 2 *", zone, utc(9996, 3, 1)) is None


def test_a_rare_schedule_skips_the_years_between_its_fire_times():
    # Only the months around each fire time have their DST transitions worked out: the 2,000 leap days of
    # 8,000 years need about 4,000 months, not 96,000.
    offsets.transitions_in_month.cache_clear()
    berlin = list(cron.fire_times("0 0 29 2 *", "Europe/Berlin", utc(2000, 1, 1), until=utc(9999, 12, 31)))
    assert offsets.transitions_in_month.cache_info().misses < 10_000
    # Every Feb 29 (midnight in Berlin is 23:00 UTC the day before).
    local_dates = [f.astimezone(ZoneInfo("Europe/Berlin")).date() for f in berlin]
    assert local_dates == [date(y, 2, 29) for y in range(2000, 10000) if calendar.isleap(y)]


def test_unbounded_iteration_is_lazy():
    fires = cron.fire_times("* * * * * *", "UTC", utc(2026, 1, 1))
    assert next(fires) == utc(2026, 1, 1, 0, 0, 1)
    assert next(fires) == utc(2026, 1, 1, 0, 0, 2)


def test_next_fire_time_is_the_first_of_fire_times():
    after = utc(2026, 3, 28, 12)
    assert cron.next_fire_time("30 2 * * *", "Europe/Berlin", after) == take("30 2 * * *", "Europe/Berlin", after, 1)[0]


def test_preview_pairs_utc_with_local_time():
    pairs = cron.preview("0 9 * * MON-FRI", "America/New_York", utc(2026, 3, 6, 15))
    assert len(pairs) == 5
    for at_utc, at_local in pairs:
        assert at_local == at_utc
        assert at_local.tzinfo == ZoneInfo("America/New_York")
        assert (at_local.hour, at_local.minute) == (9, 0)
    # New York springs forward on Sunday 2026-03-08: 09:00 is 14:00 UTC on Friday, 13:00 UTC on Monday.
    assert [p[0] for p in pairs[:2]] == [utc(2026, 3, 9, 13), utc(2026, 3, 10, 13)]
    assert cron.preview("0 9 * * MON-FRI", "America/New_York", utc(2026, 3, 6, 12), count=1)[0][0] == utc(2026, 3, 6, 14)


def test_utc_schedule_is_plain_arithmetic():
    fires = take("@daily", "UTC", utc(2026, 12, 30, 5), 3)
    assert fires == [utc(2026, 12, 31), utc(2027, 1, 1), utc(2027, 1, 2)]


def test_half_hour_offset_zone_without_dst_is_a_steady_24_hours():
    # Asia/Kolkata is +05:30 all year: 09:00 local is always 03:30 UTC.
    fires = take("0 9 * * *", "Asia/Kolkata", utc(2026, 1, 1), 366)
    assert fires[0] == utc(2026, 1, 1, 3, 30)
    assert {b - a for a, b in zip(fires, fires[1:], strict=False)} == {DAY}


def test_new_york_daily_job_keeps_its_wall_time_across_both_transitions():
    fires = take("0 9 * * *", "America/New_York", utc(2026, 1, 1), 365)
    zone = ZoneInfo("America/New_York")
    assert {(f.astimezone(zone).hour, f.astimezone(zone).minute) for f in fires} == {(9, 0)}
    assert {f.hour for f in fires} == {13, 14}


# --- DST: spring forward ----------------------------------------------------------------------------------


def test_fixed_time_job_in_spring_gap_runs_once_right_after_the_gap(gap):
    zone, at, gap_start, _ = gap
    expr = f"30 {gap_start.hour} * * *"  # e.g. 02:30, which does not exist that night
    fires = take(expr, zone, at - 12 * HOUR, 3)
    assert fires[0] == at  # 03:00 new time: the first instant after the gap
    next_day = gap_start.date() + DAY
    assert fires[1] == local(zone, next_day.year, next_day.month, next_day.day, gap_start.hour, 30)


def test_several_fixed_times_in_the_same_gap_run_once(gap):
    zone, at, gap_start, _ = gap
    h = gap_start.hour
    fires = take(f"0,15,30,45 {h} * * *", zone, at - 12 * HOUR, 2)
    next_day = gap_start.date() + DAY
    assert fires == [at, local(zone, next_day.year, next_day.month, next_day.day, h, 0)]


def test_a_minute_field_starting_with_a_number_is_fixed_time_in_the_gap_as_in_debian_cron(gap):
    # "52,*/45" starts with a digit, so Debian cron treats the job as fixed-time: one run after the gap.
    zone, at, gap_start, _ = gap
    h = gap_start.hour
    fires = take(f"52,*/45 {h} * * *", zone, at - 12 * HOUR, 2)
    next_day = gap_start.date() + DAY
    assert fires == [at, local(zone, next_day.year, next_day.month, next_day.day, h, 0)]
    # Starting with "*", the same minutes follow real time: nothing that night.
    assert take(f"*/45,52 {h} * * *", zone, at - 12 * HOUR, 1) == [local(zone, next_day.year, next_day.month,
                                                                          next_day.day, h, 0)]


def test_fixed_time_in_the_gap_and_at_its_end_is_one_run_not_two(gap):
    # 02:00 is swallowed by the gap and moved to 03:00, where the job also fires: one run.
    zone, at, gap_start, gap_end = gap
    fires = take(f"0 {gap_start.hour},{gap_end.hour} * * *", zone, at - 12 * HOUR, 2)
    assert fires[0] == at
    assert fires[1] == at + DAY - HOUR  # the next day's 02:00, a normal 23 h later in summer time


def test_fixed_time_job_with_a_seconds_field_is_still_moved_out_of_the_gap(gap):
    zone, at, gap_start, _ = gap
    fires = take(f"*/10 30 {gap_start.hour} * * *", zone, at - 12 * HOUR, 2)
    assert fires[0] == at
    assert fires[1] - fires[0] > 12 * HOUR


def test_the_run_after_the_gap_is_not_repeated_when_after_is_that_instant(gap):
    zone, at, gap_start, _ = gap
    assert cron.next_fire_time(f"30 {gap_start.hour} * * *", zone, at) > at + 12 * HOUR
    assert cron.next_fire_time(f"30 {gap_start.hour} * * *", zone, at - timedelta(microseconds=1)) == at


def test_wildcard_minute_job_inside_the_gap_hour_is_skipped_that_night(gap):
    # Not fixed-time (minute "*/15"): it follows real time, and 02:xx never happens that night.
    zone, at, gap_start, _ = gap
    fires = take(f"*/15 {gap_start.hour} * * *", zone, at - 12 * HOUR, 1)
    next_day = gap_start.date() + DAY
    assert fires == [local(zone, next_day.year, next_day.month, next_day.day, gap_start.hour, 0)]


def test_hourly_job_fires_once_per_real_hour_across_spring_forward(gap):
    zone, at, gap_start, _ = gap
    fires = list(cron.fire_times("0 * * * *", zone, at - 12 * HOUR - HOUR, until=at + 12 * HOUR - HOUR))
    assert len(fires) == 24
    assert {b - a for a, b in zip(fires, fires[1:], strict=False)} == {HOUR}
    assert at in fires  # 03:00 new time, right after 01:00 old time
    # The local calendar day has only 23 hours, so it gets 23 runs.
    tz = ZoneInfo(zone)
    day = gap_start.date()
    whole_day = cron.fire_times("0 * * * *", zone, local(zone, day.year, day.month, day.day) - HOUR,
                                until=local(zone, (day + DAY).year, (day + DAY).month, (day + DAY).day) - HOUR)
    assert sum(1 for f in whole_day if f.astimezone(tz).date() == day) == 23


# --- DST: fall back ---------------------------------------------------------------------------------------


def test_fixed_time_job_in_the_repeated_hour_runs_once_at_the_first_occurrence(repeat):
    zone, at, repeat_start = repeat
    d, h = repeat_start.date(), repeat_start.hour
    fires = take(f"30 {h} * * *", zone, at - 12 * HOUR, 2)
    first = local(zone, d.year, d.month, d.day, h, 30, fold=0)
    assert first == at - 30 * timedelta(minutes=1)  # summer time, before the clocks go back
    assert fires == [first, local(zone, (d + DAY).year, (d + DAY).month, (d + DAY).day, h, 30)]


def test_every_fixed_time_in_the_repeated_hour_runs_once(repeat):
    zone, at, repeat_start = repeat
    fires = list(cron.fire_times(f"*/1 {repeat_start.hour} * * *", zone, at - 2 * HOUR, until=at + 2 * HOUR))
    # "*/1" is not fixed-time, so both occurrences: 120 runs; the fixed-time spelling runs 60.
    assert len(fires) == 120
    fixed = ",".join(str(m) for m in range(60))
    fires = list(cron.fire_times(f"{fixed} {repeat_start.hour} * * *", zone, at - 2 * HOUR, until=at + 2 * HOUR))
    assert len(fires) == 60
    assert fires[-1] < at


def test_hourly_job_fires_in_both_occurrences_of_the_repeated_hour(repeat):
    zone, at, repeat_start = repeat
    d, h = repeat_start.date(), repeat_start.hour
    fires = list(cron.fire_times("0 * * * *", zone, at - 12 * HOUR - HOUR, until=at + 12 * HOUR - HOUR))
    assert len(fires) == 24
    assert {b - a for a, b in zip(fires, fires[1:], strict=False)} == {HOUR}
    assert local(zone, d.year, d.month, d.day, h, fold=0) in fires
    assert local(zone, d.year, d.month, d.day, h, fold=1) in fires
    # The local calendar day has 25 hours, so it gets 25 runs.
    tz = ZoneInfo(zone)
    nd = d + DAY
    whole_day = cron.fire_times("0 * * * *", zone, local(zone, d.year, d.month, d.day) - HOUR,
                                until=local(zone, nd.year, nd.month, nd.day) - HOUR)
    assert sum(1 for f in whole_day if f.astimezone(tz).date() == d) == 25


def test_half_hourly_job_keeps_real_30_minute_spacing_through_the_repeated_hour(repeat):
    zone, at, _ = repeat
    fires = list(cron.fire_times("*/30 * * * *", zone, at - 3 * HOUR, until=at + 3 * HOUR))
    assert len(fires) == 12
    assert {b - a for a, b in zip(fires, fires[1:], strict=False)} == {timedelta(minutes=30)}


def test_fixed_time_job_does_not_fire_again_when_after_is_in_the_first_occurrence(repeat):
    zone, at, repeat_start = repeat
    d, h = repeat_start.date(), repeat_start.hour
    first_0230 = local(zone, d.year, d.month, d.day, h, 30, fold=0)
    nd = d + DAY
    assert cron.next_fire_time(f"30 {h} * * *", zone, first_0230) == local(zone, nd.year, nd.month, nd.day, h, 30)
    # A wildcard job carries on in real time: the clock goes back, so next is the second 02:00, 30 min later.
    assert cron.next_fire_time("*/30 * * * *", zone, first_0230) == first_0230 + timedelta(minutes=30)
    assert cron.next_fire_time("*/30 * * * *", zone, first_0230) == local(zone, d.year, d.month, d.day, h, fold=1)


def test_fixed_time_job_does_not_fire_when_after_is_in_the_second_occurrence(repeat):
    zone, at, repeat_start = repeat
    d, h = repeat_start.date(), repeat_start.hour
    second_0215 = local(zone, d.year, d.month, d.day, h, 15, fold=1)
    nd = d + DAY
    # 02:45 already ran in the first occurrence, half an hour ago in real time.
    assert cron.next_fire_time(f"45 {h} * * *", zone, second_0215) == local(zone, nd.year, nd.month, nd.day, h, 45)
    assert cron.next_fire_time(f"*/15 {h} * * *", zone, second_0215) == second_0215 + timedelta(minutes=15)


def test_preview_shows_the_repeated_wall_time_twice_with_its_two_offsets(repeat):
    zone, at, repeat_start = repeat
    pairs = cron.preview("0 * * * *", zone, at - 61 * timedelta(minutes=1), count=2)
    locals_ = [p[1] for p in pairs]
    assert [(t.hour, t.minute) for t in locals_] == [(repeat_start.hour, 0)] * 2
    assert locals_[0].utcoffset() - locals_[1].utcoffset() == HOUR
    assert [t.fold for t in locals_] == [0, 1]


@pytest.mark.parametrize(("zone", "day"), BOTH, ids=lambda v: str(v))
@pytest.mark.parametrize("expr", ["30 2 * * *", "0,30 1-3 * * *", "*/20 * * * *", "0 * * * *", "*/7 2 * * * *"])
def test_fire_times_never_repeat_or_go_backwards_around_a_transition(zone, day, expr):
    at, _, _ = transition_on(zone, day)
    fires = list(cron.fire_times(expr, zone, at - 2 * DAY, until=at + 2 * DAY))
    assert fires == sorted(set(fires))
    assert fires and fires[0] > at - 2 * DAY and fires[-1] <= at + 2 * DAY


def test_a_whole_year_of_hourly_fires_is_one_per_real_hour_in_both_hemispheres():
    for zone in ("Europe/Berlin", "Australia/Sydney", "America/New_York"):
        fires = list(cron.fire_times("0 * * * *", zone, utc(2025, 12, 31, 23), until=utc(2026, 12, 31, 23)))
        assert len(fires) == 365 * 24, zone
        assert {b - a for a, b in zip(fires, fires[1:], strict=False)} == {HOUR}, zone


def test_daily_fixed_time_job_runs_exactly_once_every_local_day_for_a_year():
    for zone in ("Europe/Berlin", "Australia/Sydney"):
        tz = ZoneInfo(zone)
        fires = list(cron.fire_times("30 2 * * *", zone, local(zone, 2026, 1, 1), until=local(zone, 2027, 1, 1)))
        assert len(fires) == 365, zone
        assert len({f.astimezone(tz).date() for f in fires}) == 365, zone


# --- jitter ---------------------------------------------------------------------------------------------


def test_jitter_offset_is_stable_and_follows_the_documented_sha256_rule():
    for key in ("nightly-etl/default", "reports/hourly", "", "ünïcode"):
        expected = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest(), "big") % 301
        assert cron.jitter_offset(key, 300) == cron.jitter_offset(key, 300) == expected


def test_jitter_offset_is_the_same_in_another_process_with_another_hash_seed():
    # Python's hash() of a str changes per process; jitter must not, or restarts would move runs around.
    keys = [f"wf-{i}/default" for i in range(20)]
    code = ("import sys; from orchestrator.cron import jitter_offset; "
            "print([jitter_offset(k, 3600) for k in sys.argv[1:]])")
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(repo)}
    out = subprocess.run([sys.executable, "-c", code, *keys], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str([cron.jitter_offset(k, 3600) for k in keys])


def test_jitter_offset_spreads_keys_over_the_whole_range():
    values = [cron.jitter_offset(f"workflow-{i}", 99) for i in range(1000)]
    assert min(values) == 0 and max(values) == 99
    assert len(set(values)) == 100
    assert 40 < sum(values) / len(values) < 60
    assert all(cron.jitter_offset(f"k{i}", 1) in (0, 1) for i in range(50))


@pytest.mark.parametrize("max_seconds", [0, -5])
def test_jitter_offset_is_zero_without_a_positive_maximum(max_seconds):
    assert cron.jitter_offset("anything", max_seconds) == 0


# --- describe -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("* * * * *", "every minute"),
        ("*/15 * * * *", "every 15 minutes"),
        ("0 * * * *", "every hour at :00"),
        ("@hourly", "every hour at :00"),
        ("15,45 * * * *", "every hour at :15 and :45"),
        ("30 2 * * *", "every day at 02:30"),
        ("@daily", "every day at 00:00"),
        ("@midnight", "every day at 00:00"),
        ("0 9,17 * * *", "every day at 09:00 and 17:00"),
        ("0 9 * * 1-5", "at 09:00 on Monday to Friday"),
        ("0 9 * * MON-FRI", "at 09:00 on Monday to Friday"),
        ("0 10 * * SAT,SUN", "at 10:00 on Saturday and Sunday"),
        ("0 8 * * MON,WED,FRI", "at 08:00 on Monday, Wednesday and Friday"),
        ("@weekly", "at 00:00 on Sunday"),
        ("@monthly", "at 00:00 on day 1 of the month"),
        ("0 6 1,15 * *", "at 06:00 on days 1 and 15 of the month"),
        ("@yearly", "at 00:00 on 1 January"),
        ("0 0 * 1-3 *", "every day at 00:00 in January to March"),
        ("15 */2 * * *", "every 2 hours at :15"),
        ("0 9-17 * * 1-5", "every hour from 09:00 to 17:00 on Monday to Friday"),
        ("*/15 9-17 * * *", "every 15 minutes from 09:00 to 17:45"),
        ("*/15 3 * * *", "every 15 minutes from 03:00 to 03:45"),
        ("0 0 1,15 * MON", "at 00:00 on days 1 and 15 of the month or on Monday"),
        ("* * * * * *", "every second"),
        ("*/10 * * * * *", "every 10 seconds"),
        ("30 0 3 * * *", "every day at 03:00:30"),
        ("0 */5 * * * *", "every 5 minutes"),
        ("  0  9 * *  MON-FRI ", "at 09:00 on Monday to Friday"),
    ],
)
def test_describe_common_shapes(expr, words):
    assert cron.describe(expr) == words


@pytest.mark.parametrize("expr", ["*/7 * * * *", "0 0 */2 * MON", "1-59/3 */5 * * *", "0 0,1,2,3,4,5,6 * * *"])
def test_describe_falls_back_to_the_normalised_expression_for_shapes_it_cannot_say_well(expr):
    # "*/7" restarts every hour (:56 then :00), so "every 7 minutes" would be wrong.
    assert cron.describe(expr) == " ".join(expr.split())


def test_describe_rejects_invalid_expressions():
    with pytest.raises(CronError, match="61"):
        cron.describe("61 * * * *")


# --- many schedules ---------------------------------------------------------------------------------


def test_next_fire_time_for_ten_thousand_schedules_in_five_zones():
    # The scheduler's sweep (the benchmark's schedules); how long it takes is printed by
    # `manage.py bench --only cron`.
    from orchestrator.bench.cron import many_schedules

    now = utc(2026, 5, 9, 12, 3, 17)
    results = [cron.next_fire_time(expr, zone, now) for expr, zone in many_schedules()]
    assert all(r is not None and r > now for r in results)
    assert results[:3] == [utc(2026, 5, 9, 13, 0), utc(2026, 5, 10, 0, 1), utc(2026, 5, 9, 12, 5)]
