# ruff: noqa: F811 - pytest fixtures imported from tests.support
"""A workflow's calendar: runs of a year counted per day and state (settled days kept, the others
counted in one statement: the page reads at most a row per day and state, however many runs),
each day coloured by its worst state and linking to that day's runs, days in the viewer's clock;
a kept day forgotten when a run of it is cleared, marked, added or deleted; a bad year is a 400."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from orchestrator import access, clearing, run_days
from orchestrator.models import Run, RunState, Workflow
from orchestrator.runs import create_run, trigger_workflow
from orchestrator.sync import sync_workflows
from orchestrator.web import calendar
from tests.support.actions_support import chain, finished_run  # noqa: F401 - fixture
from tests.support.features_support import run_to_end, worker_loop
from tests.test_db_paths import job
from tests.test_grid import user

pytestmark = pytest.mark.django_db


@pytest.fixture
def etl():
    sync_workflows()
    return Workflow.objects.select_related("current_version").get(name="nightly_etl")


def runs(wf, at: datetime, count: int, state=RunState.SUCCEEDED):
    Run.objects.bulk_create([Run(workflow=wf, version=wf.current_version, logical_date=at + timedelta(seconds=i),
                                 trigger="schedule", state=state) for i in range(count)])


def test_days_are_counted_in_sql_coloured_by_their_worst_state_and_link_to_their_runs(client, etl):
    client.force_login(user("victor", access.VIEWERS))
    runs(etl, datetime(2026, 3, 1, 1, 0, tzinfo=UTC), 30)
    runs(etl, datetime(2026, 3, 2, 1, 0, tzinfo=UTC), 5)
    runs(etl, datetime(2026, 3, 2, 2, 0, tzinfo=UTC), 1, RunState.FAILED)
    runs(etl, datetime(2025, 12, 31, 23, 0, tzinfo=UTC), 4)  # the year before (UTC)

    url = reverse("orchestrator:web:workflow_calendar", args=[etl.name]) + "?year=2026"
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    page = html.unescape(response.content.decode())
    counted = [q for q in queries.captured_queries if "GROUP BY" in q["sql"] and "orchestrator_run" in q["sql"]]
    assert len(counted) == 1  # one aggregate; no run row is loaded
    assert not any('"orchestrator_run"."id"' in q["sql"] for q in queries.captured_queries)

    assert 'class="day st-succeeded" href="/runs/?workflow=nightly_etl&since=2026-03-01&until=2026-03-01"' in page
    assert 'title="2026-03-01: 30 runs (30 succeeded)" aria-label="1 March 2026: 30 runs (30 succeeded)"' in page
    assert 'class="day st-failed"' in page and "2026-03-02: 6 runs (1 failed, 5 succeeded)" in page
    assert "36 runs on 2 days: 1 failed, 35 succeeded" in page
    assert "2025-12-31" not in page


def test_days_follow_the_viewers_clock(etl):
    runs(etl, datetime(2025, 12, 31, 23, 30, tzinfo=UTC), 2)  # 1 January 2026 in Berlin
    berlin = calendar.zones.zoneinfo.ZoneInfo("Europe/Berlin")
    assert dict(calendar.runs_by_day(etl, 2026, berlin)) == {datetime(2026, 1, 1).date(): {"succeeded": 2}}
    assert dict(calendar.runs_by_day(etl, 2026, UTC)) == {}


def test_the_aggregate_reads_the_workflows_runs_by_index_not_the_table(etl):
    runs(etl, datetime(2026, 3, 1, tzinfo=UTC), 50)
    # Another workflow with many runs in the same days: an index of dates alone would read them all.
    other = Workflow.objects.exclude(pk=etl.pk).first()
    runs(other, datetime(2026, 3, 1, tzinfo=UTC), 5_000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE orchestrator_run")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + run_days.LIVE, {"zone": "UTC", "workflow": etl.pk,
                                                    "los": [datetime(2026, 1, 1, tzinfo=UTC)],
                                                    "his": [datetime(2027, 1, 1, tzinfo=UTC)]})
        plan = "\n".join(row[0] for row in cursor.fetchall())
    # One of the workflow's indexes (by date, or by id with the dates checked, as the statistics
    # make the planner choose): another workflow's runs are not read.
    assert "Seq Scan" not in plan and re.search(r"Index Cond: \(+workflow_id = ", plan), plan


# --- Settled days kept ---------------------------------------------------------------------------

READ = """SELECT relname, seq_tup_read + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables
          WHERE relname IN ('orchestrator_run', 'orchestrator_runday')"""

# n runs of a workflow spread over 1 January to 30 November 2025 (every day has some), succeeded.
SPREAD = """
INSERT INTO orchestrator_run (workflow_id, version_id, logical_date, trigger, params, tenant, priority, lane,
    state, reason, payload_hash, created_at, started_at, finished_at)
SELECT %(workflow)s, %(version)s, timestamptz '2025-01-01' + (g - 1) * (interval '334 days' / %(n)s), 'schedule',
       '{}'::jsonb, 'default', 0, 0, 'succeeded', '', '', now(), now(), now()
FROM generate_series(1, %(n)s) AS g
"""


def rows_read(action) -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(READ)
        before = dict(cursor.fetchall())
        action()
        cursor.execute(READ)
        after = dict(cursor.fetchall())
    return {table: after.get(table, 0) - before.get(table, 0) for table in ("orchestrator_run", "orchestrator_runday")}


def test_a_view_of_settled_days_reads_the_days_kept_not_the_runs(etl):
    small, big = etl, Workflow.objects.exclude(pk=etl.pk).select_related("current_version").first()
    read = {}
    for wf, n in ((small, 1_000), (big, 100_000)):
        with connection.cursor() as cursor:
            cursor.execute(SPREAD, {"workflow": wf.pk, "version": wf.current_version_id, "n": n})
        runs(wf, datetime(2025, 3, 3, 12, tzinfo=UTC), 1, RunState.FAILED)
        # One day of 2025 still running: it is counted live at every view.
        runs(wf, datetime(2025, 12, 15, 12, tzinfo=UTC), 3, RunState.RUNNING)
        first = rows_read(lambda wf=wf: calendar.runs_by_day(wf, 2025, UTC))
        assert first["orchestrator_run"] >= n  # the first view counts the year's runs once ...
        counts = dict(calendar.runs_by_day(wf, 2025, UTC))
        read[n] = rows_read(lambda wf=wf: calendar.runs_by_day(wf, 2025, UTC))
        # ... and what it kept reads the same later.
        assert counts == dict(calendar.runs_by_day(wf, 2025, UTC))
        assert sum(sum(by_state.values()) for by_state in counts.values()) == n + 4
        assert counts[datetime(2025, 12, 15).date()] == {"running": 3}
    # Later views: the kept days (at most 365 x states rows) and the running day's runs alone, the
    # same with 1,000 runs as with 100,000.
    assert read[1_000] == read[100_000], read
    assert read[100_000]["orchestrator_run"] <= 3 + 5, read  # the running day's (and a probe or two)
    assert read[100_000]["orchestrator_runday"] <= 334 + 1 + 5, read


def day_of(page: str, day: str) -> str:
    found = re.search(rf'class="day st-(\w+)"[^>]*title="{day}: ([^"]*)"', page)
    assert found, day
    return f"{found.group(1)}: {found.group(2)}"


def test_a_kept_day_changes_when_a_run_of_it_is_cleared_marked_added_or_deleted(client, chain):
    client.force_login(user("victor", access.VIEWERS))
    one = finished_run(chain, 1)
    finished_run(chain, 1)
    url = reverse("orchestrator:web:workflow_calendar", args=[chain.name]) + "?year=2026"

    def shown() -> str:
        response = client.get(url)
        assert response.status_code == 200
        return day_of(html.unescape(response.content.decode()), "2026-03-01")

    assert shown() == "succeeded: 2 runs (2 succeeded)"
    assert run_days.RunDay.objects.filter(workflow_id=chain.pk, day="2026-03-01").exists()  # kept
    clearing.clear(clearing.plan_run_clear([one.pk]))  # one runs again
    assert shown() == "running: 2 runs (1 running, 1 succeeded)"
    clearing.mark_runs([one.pk], "failed")
    assert shown() == "failed: 2 runs (1 failed, 1 succeeded)"
    assert shown() == "failed: 2 runs (1 failed, 1 succeeded)"  # kept again, and read so
    clearing.mark_runs([one.pk], "succeeded")
    assert shown() == "succeeded: 2 runs (2 succeeded)"
    late, _ = trigger_workflow(chain, {}, logical_date=datetime(2026, 3, 1, 18, tzinfo=UTC))  # a late run of the day
    assert shown() == "running: 3 runs (1 running, 2 succeeded)"
    Run.objects.filter(pk=late.pk).delete()
    assert shown() == "succeeded: 2 runs (2 succeeded)"
    Run.objects.filter(pk=one.pk).delete()  # retention's way: the run and its children
    assert shown() == "succeeded: 1 run (1 succeeded)"


@pytest.mark.parametrize("year", [1, 9999])
@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/Los_Angeles", "Pacific/Kiritimati"])
def test_the_first_and_last_years_are_drawn_in_any_zone(etl, year, zone):
    runs(etl, datetime(9999, 12, 31, 9, tzinfo=UTC), 1)  # 31 December 9999 in each zone
    found = calendar.runs_by_day(etl, year, calendar.zones.zoneinfo.ZoneInfo(zone))
    assert sum(sum(by_state.values()) for by_state in found.values()) == (1 if year == 9999 else 0)


@pytest.mark.parametrize("year", ["0", "10000", "twenty", "2026.5"])
def test_a_bad_year_is_a_400(client, etl, year):
    client.force_login(user("victor", access.VIEWERS))
    response = client.get(reverse("orchestrator:web:workflow_calendar", args=[etl.name]) + f"?year={year}")
    assert response.status_code == 400 and "year" in html.unescape(response.content.decode())


FORGET_CALLS = """SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions
                  WHERE funcname = 'orchestrator_runday_forget_row'"""


def forget_calls() -> int:
    with connection.cursor() as cursor:
        cursor.execute(FORGET_CALLS)
        return cursor.fetchone()[0]


def test_the_job_path_never_runs_the_calendars_triggers(chain, clock):
    # Runs of a workflow dated long ago (their creation forgets their days: a backfill's way) and
    # a job's run, ended by a worker's batches as the worker ends them.
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL track_functions = 'pl'")
    old = [create_run(chain, trigger="backfill", logical_date=datetime(2025, 5, day, tzinfo=UTC),
                      tasks=job(), now=clock.now())[0] for day in (1, 2)]
    create_run(None, trigger="job", tasks=job(), now=clock.now())
    assert forget_calls() == 2  # one per old run created
    run_to_end(old[0], clock, worker_loop())
    assert {run.state for run in Run.objects.all()} == {RunState.SUCCEEDED}
    assert forget_calls() == 2  # claims and endings: not one call
    # Where it does run: a finished run leaving its state (a clear).
    clearing.clear(clearing.plan_run_clear([old[0].pk]))
    assert forget_calls() == 3
