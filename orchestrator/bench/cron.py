"""Cron's figures for ``manage.py bench --only cron`` (on the benchmark database):

1. the scheduler's sweep: the next fire time of 10,000 schedules of ten shapes in five zones;
2. long ranges: every fire time of a rare and of a weekly schedule from 2000 to 9999, in UTC and
   in two zones with daylight saving time, with the count and the CPU time of each (caches of
   offset transitions cleared first, so each figure is a cold start);
3. backfill dry runs over the widest range of logical dates a request may ask for
   (1900-01-01 to 2199-12-31), through ``backfill.plan`` as the API, the admin and the CLI call
   it: wall time, and the count or the reason it was refused.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from orchestrator import cron
from orchestrator.cron import expression, offsets
from orchestrator.limits import LOGICAL_DATE_MAX, LOGICAL_DATE_MIN

SPEC = {"params": {}, "tasks": {"noop": {"kind": "python", "ref": "workflows.jobs:noop", "upstream": []}}}
ZONES = ("UTC", "Europe/Berlin", "America/New_York")


def _clear_caches() -> None:
    offsets.transitions_in_month.cache_clear()
    offsets.first_transition_from.cache_clear()
    expression.parse.cache_clear()


def many_schedules() -> list[tuple[str, str]]:
    zones = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Sydney", "Asia/Kolkata"]
    shapes = ["{m} * * * *", "{m} 2 * * *", "*/5 * * * *", "{m} 9 * * 1-5", "{m} */3 * * *", "{m} 0 1 * *",
              "@daily", "*/10 * * * * *", "{m} 4 * * SUN", "{m} 0 1 1 *"]
    return [(shapes[i % len(shapes)].format(m=i % 60), zones[i % len(zones)]) for i in range(10_000)]


def bench_sweep(out) -> dict:
    schedules = many_schedules()
    now = datetime(2026, 5, 9, 12, 3, 17, tzinfo=UTC)
    figures = {}
    _clear_caches()
    for label in ("cold", "warm"):
        started = time.process_time()
        for expr, zone in schedules:
            cron.next_fire_time(expr, zone, now)
        figures[label] = time.process_time() - started
        out(f"  next fire time of {len(schedules):,} schedules in 5 zones ({label} caches): "
            f"{figures[label]:.2f} s CPU")
    return figures


def bench_long_ranges(out) -> dict:
    figures = {}
    after, until = datetime(2000, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, tzinfo=UTC)
    for expr in ("0 0 29 2 *", "30 2 * * 0"):
        for zone in ZONES:
            _clear_caches()
            started = time.process_time()
            count = sum(1 for _ in cron.fire_times(expr, zone, after, until=until))
            seconds = time.process_time() - started
            figures[f"{expr} {zone}"] = seconds
            out(f"  '{expr}' {zone:<17} 2000-9999: {count:>7,} fire times in {seconds:5.2f} s CPU")
    return figures


def _workflow():
    # Django's models are imported here, not above: the cron tests use many_schedules() without Django.
    from orchestrator.models import Workflow, WorkflowVersion

    workflow, _ = Workflow.objects.get_or_create(name="bench_cron")
    version, _ = WorkflowVersion.objects.get_or_create(workflow=workflow, number=1,
                                                       defaults={"hash": "bench-cron", "spec": SPEC})
    Workflow.objects.filter(pk=workflow.pk).update(current_version=version, paused=False, present=True)
    return Workflow.objects.select_related("current_version").get(pk=workflow.pk)


def bench_dry_runs(out) -> dict:
    from orchestrator import backfill

    workflow = _workflow()
    start, end = LOGICAL_DATE_MIN, LOGICAL_DATE_MAX - timedelta(seconds=1)
    figures = {}
    for expr, zone in (("0 0 29 2 *", "Europe/Berlin"), ("0 0 29 2 */7", "America/New_York"),
                       ("0 9 * * 1", "Europe/Berlin"), ("* * * * *", "UTC")):
        _clear_caches()
        started = time.perf_counter()
        try:
            plan = backfill.plan(workflow, start, end, expr=expr, timezone=zone)
            answer = f"{plan.count:,} fire times"
        except backfill.BackfillError as exc:
            answer = f"refused: {str(exc)[:90]}..."
        seconds = time.perf_counter() - started
        figures[f"{expr} {zone}"] = seconds
        out(f"  dry run '{expr}' {zone:<16} {start:%Y-%m-%d}..{end:%Y-%m-%d}: {seconds:5.2f} s, {answer}")
    return figures


def run(out) -> dict:
    return {"sweep": bench_sweep(out), "long_ranges": bench_long_ranges(out), "dry_runs": bench_dry_runs(out)}
