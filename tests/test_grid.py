"""The workflow page's grid: runs as columns by logical date with readable date labels, a bar per
task run as tall as it took, more than 25 runs on request, and a picked cell's task run with the
actions an operator can take on it."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from orchestrator import access
from orchestrator.models import Run, RunState, TaskRun, TaskState, Workflow
from orchestrator.runs import create_run
from orchestrator.sync import sync_workflows

pytestmark = pytest.mark.django_db


@pytest.fixture
def etl():
    sync_workflows()
    return Workflow.objects.select_related("current_version").get(name="nightly_etl")


def user(name, group):
    person = User.objects.create_user(name, password="pw-" + name)
    access.add_to_group(person, group)
    return person


def run_at(wf, logical_date: datetime, seconds: float = 10.0) -> Run:
    """A succeeded run of ``wf`` for ``logical_date`` whose every task run took ``seconds``."""
    run, _ = create_run(wf, trigger="manual", logical_date=logical_date)
    Run.objects.filter(pk=run.pk).update(state=RunState.SUCCEEDED, started_at=logical_date,
                                         finished_at=logical_date + timedelta(seconds=seconds))
    TaskRun.objects.filter(run=run).update(state=TaskState.SUCCEEDED, attempts=1, started_at=logical_date,
                                           finished_at=logical_date + timedelta(seconds=seconds))
    return run


def columns(html: str) -> list[int]:
    """The run ids of the grid's columns, left to right."""
    return [int(i) for i in re.findall(r'class="runbar st-\w+(?: sel)?" href="\?(?:[^"]*&amp;)?run=(\d+)"', html)]


def grid_page(client, wf, query: str = "") -> str:
    response = client.get(reverse("orchestrator:web:workflow", args=[wf.name]) + query)
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


@pytest.mark.time_sensitive
def test_columns_follow_the_logical_date_and_carry_readable_date_labels(client, etl):
    client.force_login(user("victor", access.VIEWERS))
    today = run_at(etl, datetime(2026, 3, 1, 1, 30, tzinfo=UTC))
    # A backfill made later (higher ids) for earlier dates: they belong left of today's run.
    november = [run_at(etl, datetime(2025, 11, day, 1, 30, tzinfo=UTC)) for day in (2, 1)]
    html = grid_page(client, etl)
    assert columns(html) == [november[1].pk, november[0].pk, today.pk]
    dates = re.findall(r'<time class="grid-date" datetime="([^"]+)" data-short title="([^"]+)">([^<]+)</time>', html)
    assert dates == [("2025-11-01T01:30:00+00:00", "2025-11-01 01:30:00 UTC", "11-01 01:30"),
                     ("2025-11-02T01:30:00+00:00", "2025-11-02 01:30:00 UTC", "11-02 01:30"),
                     ("2026-03-01T01:30:00+00:00", "2026-03-01 01:30:00 UTC", "03-01 01:30")]


@pytest.mark.time_sensitive
def test_each_cell_is_its_states_colour_with_a_bar_as_tall_as_its_task_run_took(client, etl):
    client.force_login(user("victor", access.VIEWERS))
    short = run_at(etl, datetime(2026, 2, 1, tzinfo=UTC), seconds=10)
    long = run_at(etl, datetime(2026, 2, 2, tzinfo=UTC), seconds=40)
    never = run_at(etl, datetime(2026, 2, 3, tzinfo=UTC))
    TaskRun.objects.filter(run=never).update(state=TaskState.UPSTREAM_FAILED, attempts=0, started_at=None)
    html = grid_page(client, etl)
    bars = {}
    for href, title, y, height in re.findall(
            r'<a class="cell st-\w+" href="(/task-runs/\d+/)"[^>]*title="([^"]*)"><svg width="16" height="24"[^>]*>'
            r'<rect x="6" y="(\d+)" width="4" height="(\d+)"', html):
        bars[int(href.split("/")[2])] = (title, int(y), int(height))
    six = TaskRun.objects.filter(run=long).count()
    assert len(bars) == 3 * six
    for tr in TaskRun.objects.filter(run=short):
        assert bars[tr.pk][1:] == (18, 6) and bars[tr.pk][0].endswith("succeeded, 10.0 s")
    for tr in TaskRun.objects.filter(run=long):
        assert bars[tr.pk][1:] == (0, 24)
    for tr in TaskRun.objects.filter(run=never):
        assert bars[tr.pk][1:] == (24, 0) and bars[tr.pk][0].endswith("upstream_failed, —")
    # The cell itself carries the state (class st-<state>, coloured by the stylesheet).
    assert html.count('<a class="cell st-upstream_failed"') == six


@pytest.mark.time_sensitive
def test_the_grid_shows_more_runs_on_request_and_pages_back_by_logical_date(client, etl):
    client.force_login(user("victor", access.VIEWERS))
    start = datetime(2026, 1, 1, 1, 30, tzinfo=UTC)
    runs = [run_at(etl, start + timedelta(days=day)) for day in range(30)]
    ids = [run.pk for run in runs]
    html = grid_page(client, etl)
    assert columns(html) == ids[-25:]
    assert "the last 25 runs" in html and 'href="?runs=50#grid"' in html
    assert f'href="?before={ids[5]}#grid" id="grid-older"' in html
    assert columns(grid_page(client, etl, "?runs=50")) == ids
    older = grid_page(client, etl, f"?before={ids[5]}")
    assert columns(older) == ids[:5]
    assert 'id="grid-older"' not in older and 'href="?#grid" id="grid-newest"' in older
    # Picking a run keeps the page of the grid.
    assert columns(grid_page(client, etl, f"?runs=50&before={ids[20]}&run={ids[3]}")) == ids[:20]
    assert f'href="?runs=50&amp;before={ids[20]}&amp;run={ids[3]}"' in grid_page(client, etl, f"?runs=50&before={ids[20]}")


@pytest.mark.time_sensitive
def test_a_bad_grid_size_or_cursor_is_a_400_that_says_which(client, etl):
    client.force_login(user("victor", access.VIEWERS))
    response = client.get(reverse("orchestrator:web:workflow", args=[etl.name]) + "?runs=lots")
    assert response.status_code == 400 and "runs must be a whole number from 1 to 200" in response.content.decode()
    response = client.get(reverse("orchestrator:web:workflow", args=[etl.name]) + "?runs=5000")
    assert response.status_code == 400
    response = client.get(reverse("orchestrator:web:workflow", args=[etl.name]) + "?before=-1")
    assert response.status_code == 400 and "before must be a whole number" in response.content.decode()


@pytest.mark.time_sensitive
def test_a_picked_cell_shows_its_task_run_with_the_actions_for_operators_only(client, etl):
    run = run_at(etl, datetime(2026, 2, 1, tzinfo=UTC))
    extract = TaskRun.objects.get(run=run, task="extract")
    query = f"?run={run.pk}&task=extract"
    client.force_login(user("olivia", access.OPERATORS))
    # The cell asks for the panel only (htmx); its href still opens the task run without script.
    html = grid_page(client, etl)
    assert (f'href="/task-runs/{extract.pk}/" hx-get="?run={run.pk}&amp;task=extract&amp;panel=1" '
            'hx-target="#grid-panel"' in html)
    panel = client.get(reverse("orchestrator:web:workflow", args=[etl.name]) + query + "&panel=1",
                       HTTP_HX_REQUEST="true")
    text = panel.content.decode()
    assert text.lstrip().startswith('<section class="card grid-panel" id="grid-panel"') and 'id="live"' not in text
    assert f'<a href="/task-runs/{extract.pk}/">extract</a> in <a href="/runs/{run.pk}/">run #{run.pk}</a>' in text
    assert 'id="grid-clear"' in text and 'id="grid-mark-failed"' in text and 'id="grid-retry"' not in text
    assert (f'value="/workflows/nightly_etl/?run={run.pk}&amp;task=extract#grid-panel"' in text)
    assert f'hx-confirm="Clear extract of run #{run.pk} and every task downstream of it?' in text
    # The full page shows it too (after an action redirects back here).
    assert 'id="grid-clear"' in grid_page(client, etl, query)
    # Clearing from the panel comes back to it.
    response = client.post(reverse("orchestrator:web:task_run_action", args=[extract.pk, "clear"]),
                           {"next": f"/workflows/nightly_etl/?run={run.pk}&task=extract#grid-panel"})
    assert response.status_code == 302 and response["Location"].endswith(f"?run={run.pk}&task=extract#grid-panel")
    assert TaskRun.objects.get(pk=extract.pk).state == TaskState.SCHEDULED

    client.force_login(user("victor", access.VIEWERS))
    text = client.get(reverse("orchestrator:web:workflow", args=[etl.name]) + query + "&panel=1",
                      HTTP_HX_REQUEST="true").content.decode()
    # The live update of a page showing a picked cell still gets the live part, not the panel.
    live = client.get(reverse("orchestrator:web:workflow", args=[etl.name]) + query, HTTP_HX_REQUEST="true")
    assert '<div id="live"' in live.content.decode()
    assert "extract</a> in" in text and "<form" not in text
    # An unknown task or a run of another workflow: an empty panel.
    text = grid_page(client, etl, f"?run={run.pk}&task=nope")
    assert '<section class="card grid-panel empty" id="grid-panel"' in text
