"""Page speed with a big history: fills the (bench) database with a million runs, then measures
the server time of the pages that must stay fast (the runs list, its later keyset pages and
filters, a workflow's grid) through Django's test client.

Called by ``manage.py bench --only pages`` on a dedicated database. Filling is one
``INSERT … SELECT generate_series`` statement, so a million runs take seconds, not minutes.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import sys
import time
import warnings
from datetime import UTC, datetime

from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import override_settings

from orchestrator import clock
from orchestrator.models import Run, TaskRun, Workflow
from orchestrator.run_days import RunDay
from orchestrator.runs import task_runs_for
from orchestrator.sync import sync_workflows

TARGET_MS = 150.0

# Runs spread over the workflows, one logical date per minute going back from now; about one in
# fifty failed, a few manual and API runs among the scheduled ones. The moduli are odd so that
# every workflow gets its share of each state and trigger (the workflow is g mod their count).
FILL_RUNS = """
INSERT INTO orchestrator_run (workflow_id, version_id, logical_date, trigger, params, tenant, priority, lane,
    state, reason, payload_hash, created_at, started_at, finished_at, schedule_delay)
SELECT w.id, w.current_version_id, ts, tr, '{}'::jsonb, 'default', 0, 0, st, '', '', ts, ts + interval '2 seconds',
       ts + (20 + (g % 40)) * interval '1 second', CASE WHEN tr = 'schedule' THEN 0.5 + (g % 7) * 0.1 END
FROM generate_series(1, %(n)s) AS g
CROSS JOIN LATERAL (SELECT now() - (%(n)s - g) * interval '1 minute' AS ts,
    CASE WHEN g %% 49 = 0 THEN 'failed' WHEN g %% 997 = 0 THEN 'cancelled' ELSE 'succeeded' END AS st,
    CASE WHEN g %% 39 = 0 THEN 'manual' WHEN g %% 101 = 0 THEN 'api' WHEN g %% 503 = 0 THEN 'backfill'
         ELSE 'schedule' END AS tr) AS v
JOIN (SELECT id, current_version_id, row_number() OVER (ORDER BY id) - 1 AS k,
             count(*) OVER () AS c FROM orchestrator_workflow WHERE current_version_id IS NOT NULL) AS w
  ON w.k = g %% w.c
"""


# A run's task runs in one statement: ``n`` distinct tasks t000000, t000001, ... each downstream of
# the one before (no mapping), or, with a mapped task's name, its ``n`` instances (its own row is
# made apart). One in 97 is dead; each took 5 ms, one after the other from the run's start.
FILL_TASK_RUNS = """
INSERT INTO orchestrator_taskrun (run_id, task, map_index, state, spec, upstream, queue, priority, tenant, lane,
    attempts, max_attempts, error, created_at, started_at, finished_at)
SELECT r.id, coalesce(%(mapped)s, 't' || lpad(g::text, 6, '0')), CASE WHEN %(mapped)s IS NULL THEN -1 ELSE g END,
       CASE WHEN g %% 97 = 5 THEN 'dead' ELSE 'succeeded' END, '{"kind": "python", "ref": "bench:noop"}'::jsonb,
       CASE WHEN %(mapped)s IS NOT NULL OR g = 0 THEN '{}'::varchar[]
            ELSE ARRAY['t' || lpad((g - 1)::text, 6, '0')]::varchar[] END,
       'default', 0, 'default', 0, 1, 1, CASE WHEN g %% 97 = 5 THEN 'ValueError: item said no' ELSE '' END,
       r.created_at, r.started_at + g * interval '5 milliseconds', r.started_at + (g + 1) * interval '5 milliseconds'
FROM orchestrator_run r CROSS JOIN generate_series(0, %(n)s - 1) AS g
WHERE r.id = %(run)s
"""

# One attempt per task run of the run, as it ended.
FILL_ATTEMPTS = """
INSERT INTO orchestrator_attempt (task_run_id, number, outcome, started_at, finished_at, error, traceback, log_path)
SELECT id, 1, CASE WHEN state = 'dead' THEN 'failed' ELSE 'succeeded' END, started_at, finished_at, error, '', ''
FROM orchestrator_taskrun WHERE run_id = %(run)s AND map_index >= CASE WHEN %(mapped)s IS NULL THEN -1 ELSE 0 END
"""


def fill_run(run: Run, n: int, mapped: str | None = None) -> None:
    """Give ``run`` (created, without task runs) ``n`` task runs that ended: distinct tasks, or
    the instances of the mapped task ``mapped`` (whose own row, the map's summary, comes first)."""
    if mapped is not None:
        TaskRun.objects.create(run=run, task=mapped, map_index=-1, state="succeeded", attempts=0,
                               spec={"kind": "python", "ref": "bench:noop", "map_over": "items"},
                               started_at=run.started_at, finished_at=run.finished_at)
    with connection.cursor() as cursor:
        params = {"run": run.pk, "n": n, "mapped": mapped}
        cursor.execute(FILL_TASK_RUNS, params)
        cursor.execute(FILL_ATTEMPTS, params)
        if mapped is not None:
            # The map's result, as its end writes it: every instance's result in one list.
            cursor.execute("UPDATE orchestrator_taskrun SET result = (SELECT jsonb_agg(g::bigint * g ORDER BY g) "
                           "FROM generate_series(0, %(n)s - 1) AS g) WHERE run_id = %(run)s AND map_index = -1", params)
        cursor.execute("ANALYZE orchestrator_taskrun")
        cursor.execute("ANALYZE orchestrator_attempt")


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def fill(runs: int, out) -> Workflow:
    sync_workflows()
    workflow = Workflow.objects.select_related("current_version").get(name="nightly_etl")
    have = Run.objects.count()
    if have < runs:
        started = time.monotonic()
        with connection.cursor() as cursor:
            cursor.execute(FILL_RUNS.replace("%(n)s", str(int(runs - have))).replace("%%", "%"))
        out.write(f"  filled {runs - have:,} runs in {time.monotonic() - started:.1f}s\n")
    # The grid's cells: task runs of the workflow's newest runs (the rest of the history has none,
    # as after retention pruned old task runs; the grid only reads the newest runs).
    recent = list(Run.objects.filter(workflow=workflow).order_by("-id")[:25])
    missing = [run for run in recent if not TaskRun.objects.filter(run=run).exists()]
    rows = []
    for index, run in enumerate(missing):
        for task_run in task_runs_for(run, workflow.current_version.spec["tasks"], run.logical_date):
            task_run.state = "dead" if index == 3 and not task_run.upstream else run.state
            task_run.attempts, task_run.finished_at = 1, run.finished_at
            if task_run.state == "dead":
                task_run.error = "ValueError: upstream API said no"
            rows.append(task_run)
    TaskRun.objects.bulk_create(rows)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE orchestrator_run")
        cursor.execute("ANALYZE orchestrator_taskrun")
    return workflow


def time_pages(pages: dict[str, str], out, repeat: int = 15) -> dict[str, dict[str, float]]:
    """The server time of each page (label -> path), as a superuser through Django's test client:
    two requests to warm up, then the median and p95 of ``repeat``."""
    user, _ = get_user_model().objects.get_or_create(username="bench-pages", defaults={"is_superuser": True})
    results: dict[str, dict[str, float]] = {}
    # WhiteNoise notes that the benchmark never collected the static files; nothing is served here.
    with quiet_logins(), override_settings(ALLOWED_HOSTS=["testserver"], DEBUG=False), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        client = Client()
        client.force_login(user)
        for label, url in pages.items():
            for _ in range(2):  # warm caches and connections
                assert client.get(url).status_code == 200, url
            times = []
            for _ in range(repeat):
                started = time.perf_counter()
                response = client.get(url)
                times.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200, url
            results[label] = {"median_ms": statistics.median(times), "p95_ms": _percentile(times, 0.95)}
            flag = "ok" if results[label]["p95_ms"] < TARGET_MS else f"SLOWER than {TARGET_MS:.0f} ms"
            out.write(f"  {label:<40} median {results[label]['median_ms']:7.1f} ms   "
                      f"p95 {results[label]['p95_ms']:7.1f} ms   {flag}\n")
    return results


@contextlib.contextmanager
def quiet_logins():
    """Not a line per login of the measuring client (django-axes logs each one)."""
    axes = logging.getLogger("axes")
    level = axes.level
    axes.setLevel(logging.WARNING)
    try:
        yield
    finally:
        axes.setLevel(level)


def explain(sql_and_params) -> str:
    sql, params = sql_and_params
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def big_runs(n: int, out) -> dict[str, Run]:
    """Two runs of ``n`` task runs each, made once per database: ``n`` distinct tasks, and a map
    over ``n`` items; vacuumed, so that counting reads the index alone as it does once autovacuum
    has been by."""
    workflow, _ = Workflow.objects.get_or_create(name=f"bench_big_{n}")
    made = {}
    for shape, mapped in (("tasks", None), ("map", "square")):
        run = Run.objects.filter(workflow=workflow, reason=shape).first()
        if run is None:
            started = time.monotonic()
            now = clock.now()
            run = Run.objects.create(workflow=workflow, trigger="manual", state="failed", reason=shape,
                                     logical_date=now, started_at=now, finished_at=now)
            fill_run(run, n, mapped)
            out.write(f"  filled a run of {n:,} task runs ({shape}) in {time.monotonic() - started:.1f}s\n")
        made[shape] = run
    # Fresh statistics (and a visibility map, for the index-only counts) before the pages are timed;
    # VACUUM cannot run inside a transaction (a test's), ANALYZE can.
    command = "ANALYZE" if connection.in_atomic_block else "VACUUM ANALYZE"
    with connection.cursor() as cursor:
        cursor.execute(f"{command} orchestrator_taskrun")
        cursor.execute(f"{command} orchestrator_attempt")
    return made


def big_run_pages(made: dict[str, Run]) -> dict[str, str]:
    """The pages and API answers of the big runs that must stay fast (label -> path)."""
    tasks, mapped = made["tasks"], made["map"]
    own = TaskRun.objects.get(run=mapped, map_index=-1)
    deep = TaskRun.objects.filter(run=mapped, map_index__gte=0).order_by("-map_index").values_list("id", flat=True)[100]
    return {
        "run page, 100,000 tasks": f"/runs/{tasks.pk}/",
        "run page, map over 100,000": f"/runs/{mapped.pk}/",
        "API run, 100,000 tasks": f"/api/runs/{tasks.pk}/",
        "API run, map over 100,000": f"/api/runs/{mapped.pk}/",
        "API task runs, deep page": f"/api/runs/{mapped.pk}/task-runs/?cursor=after.{deep}",
        "mapped task's task-run page": f"/task-runs/{own.pk}/",
        "instances page, dead, deep": f"/task-runs/{own.pk}/instances/?state=dead&from=90000",
    }


# A workflow's runs spread evenly over one calendar year (a million: one every 31.5 s), one in
# forty-nine failed, none of them active: every day of the year settles.
FILL_YEAR = """
INSERT INTO orchestrator_run (workflow_id, logical_date, trigger, params, tenant, priority, lane, state, reason,
    payload_hash, created_at, started_at, finished_at)
SELECT %(workflow)s, %(start)s::timestamptz + (g - 1) * ((%(end)s::timestamptz - %(start)s::timestamptz) / %(n)s),
       'schedule', '{}'::jsonb, 'default', 0, 0, CASE WHEN g %% 49 = 0 THEN 'failed' ELSE 'succeeded' END, '', '',
       now(), now(), now()
FROM generate_series(1, %(n)s) AS g
"""


def calendar(out, runs: int = 1_000_000, repeat: int = 15) -> dict[str, dict[str, float]]:
    """The calendar of a workflow with ``runs`` runs in last year: its first view (which counts
    the year's runs and keeps the settled days: timed three times, the kept days deleted before
    each), then views of the year kept."""
    year = clock.now().year - 1
    workflow, _ = Workflow.objects.get_or_create(name="bench_calendar")
    have = Run.objects.filter(workflow=workflow).count()
    if have < runs:
        started = time.monotonic()
        with connection.cursor() as cursor:
            cursor.execute(FILL_YEAR, {"workflow": workflow.pk, "n": runs - have, "start": datetime(year, 1, 1, tzinfo=UTC),
                                       "end": datetime(year + 1, 1, 1, tzinfo=UTC)})
            cursor.execute("ANALYZE orchestrator_run")
        out.write(f"  filled {runs - have:,} runs of one workflow in {year} in {time.monotonic() - started:.1f}s\n")
    url = f"/workflows/{workflow.name}/calendar/?year={year}"
    user, _ = get_user_model().objects.get_or_create(username="bench-pages", defaults={"is_superuser": True})
    client = Client()
    client.force_login(user)
    first = []
    with override_settings(ALLOWED_HOSTS=["testserver"], DEBUG=False), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(3):
            RunDay.objects.filter(workflow_id=workflow.pk).delete()
            started = time.perf_counter()
            assert client.get(url).status_code == 200, url
            first.append((time.perf_counter() - started) * 1000)
    out.write(f"  {f'calendar, first view ({runs:,} runs)':<40} min {min(first):7.1f} ms   max {max(first):7.1f} ms\n")
    results = {"calendar, first view": {"min_ms": min(first), "max_ms": max(first)}}
    results.update(time_pages({f"calendar, kept ({runs:,} runs)": url}, out, repeat))
    return results


def run_big(out=sys.stdout, n: int = 100_000, repeat: int = 15) -> dict[str, dict[str, float]]:
    out.write(f"pages: runs of {n:,} task runs\n")
    return time_pages(big_run_pages(big_runs(n, out)), out, repeat)


def run(out=sys.stdout, runs: int = 1_000_000, repeat: int = 15, big: int = 100_000) -> dict[str, dict[str, float]]:
    from orchestrator.web.runs import filter_runs

    out.write(f"pages: {runs:,} runs\n")
    workflow = fill(runs, out)
    total = Run.objects.count()
    middle = Run.objects.order_by("-id").values_list("id", flat=True)[total // 2]
    newest = Run.objects.order_by("-id").values_list("logical_date", flat=True).first()
    day = newest.date()
    pages = {
        "runs list, first page": "/runs/",
        "runs list, keyset page in the middle": f"/runs/?before={middle}",
        "runs list, state=failed": "/runs/?state=failed",
        "runs list, workflow + trigger=manual": f"/runs/?workflow={workflow.name}&trigger=manual",
        "runs list, one day": f"/runs/?since={day.isoformat()}&until={day.isoformat()}",
        "runs list, failed + keyset page": f"/runs/?state=failed&before={middle}",
        "workflow grid (25 runs x tasks)": f"/workflows/{workflow.name}/",
        "workflows list": "/workflows/",
        "dashboard": "/",
        "dead-letter queue": "/dead-letter/",
    }
    results = time_pages(pages, out, repeat)
    results.update(calendar(out, runs, repeat))
    results.update(run_big(out, n=big, repeat=repeat))
    # The plans behind the runs list: every one must walk an index, never scan the table.
    checks = {
        "first page": filter_runs({}).order_by("-id")[:51],
        "keyset page": filter_runs({}).filter(pk__lt=middle).order_by("-id")[:51],
        "state filter": filter_runs({"state": "failed"}).filter(pk__lt=middle).order_by("-id")[:51],
        "trigger filter": filter_runs({"trigger": "manual"}).order_by("-id")[:51],
        "grid runs": Run.objects.filter(workflow=workflow).order_by("-id")[:25],
    }
    for label, queryset in checks.items():
        plan = explain(queryset.query.sql_with_params())
        scans = "seq scan" if "Seq Scan on orchestrator_run" in plan else "index"
        first_line = plan.splitlines()[1].strip() if len(plan.splitlines()) > 1 else plan
        out.write(f"  plan {label:<15} {scans:<9} {first_line[:90]}\n")
        results[f"plan {label}"] = {"seq_scan": float(scans == "seq scan")}
    return results
