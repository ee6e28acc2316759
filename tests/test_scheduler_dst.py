"""Daylight saving time through the scheduler: a FakeClock walks across each transition in
15-minute steps and the runs' logical dates (UTC) are what Debian cron would do. Berlin (northern
hemisphere) and Sydney (southern): fixed-time jobs in a spring-forward gap run once right after
it and once in a repeated hour; wildcard jobs follow real elapsed time."""

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.clock import FakeClock
from orchestrator.models import Run
from tests.test_scheduler import make_schedule, make_workflow, scheduler

pytestmark = pytest.mark.django_db


def utc(month, day, hour, minute=0):
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


def walk(tz, start, end):
    """Three schedules in `tz`, ticked every 15 minutes from `start` to `end` with the default
    catchup policy (latest): every fire time must be reached on time, none twice."""
    clock = FakeClock(start)
    workflow = make_workflow()
    schedules = {
        "fixed": make_schedule(workflow, "30 2 * * *", now=start, tz=tz, name="fixed"),
        "minutes": make_schedule(workflow, "*/30 2 * * *", now=start, tz=tz, name="minutes"),
        "hourly": make_schedule(workflow, "0 * * * *", now=start, tz=tz, name="hourly"),
    }
    ticker = scheduler(clock)
    steps = 0
    while clock.now() < end:
        clock.advance(minutes=15)
        ticker.tick()
        steps += 1
        assert steps < 600
    return {
        key: [r.logical_date for r in Run.objects.filter(schedule=s).order_by("logical_date")]
        for key, s in schedules.items()
    }


def every_hour(start, end):
    hours = int((end - start).total_seconds() // 3600)
    return [start.replace(minute=0) + timedelta(hours=h + 1) for h in range(hours)]


def test_berlin_spring_forward():
    # 2026-03-29 02:00 CET -> 03:00 CEST (01:00 UTC): 02:00-02:59 does not exist.
    start, end = utc(3, 28, 0), utc(3, 30, 3)
    runs = walk("Europe/Berlin", start, end)
    # 02:30 CET, then once right after the gap (03:00 CEST), then 02:30 CEST.
    assert runs["fixed"] == [utc(3, 28, 1, 30), utc(3, 29, 1), utc(3, 30, 0, 30)]
    # Not fixed-time: its wall times were skipped, so on the 29th it does not fire at all.
    assert runs["minutes"] == [utc(3, 28, 1), utc(3, 28, 1, 30), utc(3, 30, 0), utc(3, 30, 0, 30)]
    assert runs["hourly"] == every_hour(start, end)  # 23 real hours on the 29th, one run each


def test_berlin_fall_back():
    # 2026-10-25 03:00 CEST -> 02:00 CET (01:00 UTC): 02:00-02:59 happens twice.
    start, end = utc(10, 23, 23), utc(10, 26, 3)
    runs = walk("Europe/Berlin", start, end)
    # Once, in the first 02:30 (CEST); the repeated one is not run again.
    assert runs["fixed"] == [utc(10, 24, 0, 30), utc(10, 25, 0, 30), utc(10, 26, 1, 30)]
    assert runs["minutes"] == [
        utc(10, 24, 0), utc(10, 24, 0, 30),
        utc(10, 25, 0), utc(10, 25, 0, 30), utc(10, 25, 1), utc(10, 25, 1, 30),  # both 02:xx hours
        utc(10, 26, 1), utc(10, 26, 1, 30),
    ]
    assert runs["hourly"] == every_hour(start, end)  # 25 real hours on the 25th


def test_sydney_spring_forward_in_october():
    # 2026-10-04 02:00 AEST -> 03:00 AEDT (2026-10-03 16:00 UTC).
    start, end = utc(10, 2, 12), utc(10, 5, 12)
    runs = walk("Australia/Sydney", start, end)
    assert runs["fixed"] == [utc(10, 2, 16, 30), utc(10, 3, 16), utc(10, 4, 15, 30)]
    assert runs["minutes"] == [utc(10, 2, 16), utc(10, 2, 16, 30), utc(10, 4, 15), utc(10, 4, 15, 30)]
    assert runs["hourly"] == every_hour(start, end)


def test_sydney_fall_back_in_april():
    # 2026-04-05 03:00 AEDT -> 02:00 AEST (2026-04-04 16:00 UTC).
    start, end = utc(4, 3, 12), utc(4, 6, 12)
    runs = walk("Australia/Sydney", start, end)
    assert runs["fixed"] == [utc(4, 3, 15, 30), utc(4, 4, 15, 30), utc(4, 5, 16, 30)]
    assert runs["minutes"] == [
        utc(4, 3, 15), utc(4, 3, 15, 30),
        utc(4, 4, 15), utc(4, 4, 15, 30), utc(4, 4, 16), utc(4, 4, 16, 30),
        utc(4, 5, 16), utc(4, 5, 16, 30),
    ]
    assert runs["hourly"] == every_hour(start, end)


def test_a_scheduler_that_was_down_across_the_gap_still_runs_the_swallowed_fixed_time_once():
    # Down from 00:00 to 05:00 UTC on the day Berlin springs forward; catchup "all".
    start = utc(3, 29, 0)
    clock = FakeClock(start)
    workflow = make_workflow()
    schedule = make_schedule(workflow, "30 2 * * *", now=start, tz="Europe/Berlin", catchup="all")
    clock.set(utc(3, 29, 5))
    scheduler(clock).tick()
    assert [r.logical_date for r in Run.objects.filter(schedule=schedule)] == [utc(3, 29, 1)]
    schedule.refresh_from_db()
    assert schedule.next_fire_at == utc(3, 30, 0, 30)
