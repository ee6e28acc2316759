"""A workflow's calendar: runs of a year counted per day and state in one statement (the page gets
at most a row per day and state, however many runs), each day coloured by its worst state and
linking to that day's runs, days in the viewer's clock; a bad year is a 400."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from orchestrator import access
from orchestrator.models import Run, RunState, Workflow
from orchestrator.sync import sync_workflows
from orchestrator.web import calendar
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
        cursor.execute("EXPLAIN " + calendar.RUNS_BY_DAY, {"zone": "UTC", "workflow": etl.pk,
                                                           "lo": datetime(2026, 1, 1, tzinfo=UTC),
                                                           "hi": datetime(2027, 1, 1, tzinfo=UTC)})
        plan = "\n".join(row[0] for row in cursor.fetchall())
    # One of the workflow's indexes (by date, or by id with the dates checked, as the statistics
    # make the planner choose): another workflow's runs are not read.
    assert "Seq Scan" not in plan and re.search(r"Index Cond: \(+workflow_id = ", plan), plan


@pytest.mark.parametrize("year", ["0", "10000", "twenty", "2026.5"])
def test_a_bad_year_is_a_400(client, etl, year):
    client.force_login(user("victor", access.VIEWERS))
    response = client.get(reverse("orchestrator:web:workflow_calendar", args=[etl.name]) + f"?year={year}")
    assert response.status_code == 400 and "year" in html.unescape(response.content.decode())
