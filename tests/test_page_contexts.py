"""What the pages compute, without a request: the grid's bars and pages, the run page's timeline.
Each builder takes the time as an argument, so no clock is pinned and none is read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.models import Attempt, Run, RunState, TaskRun, TaskState, Workflow
from orchestrator.runs import create_run
from orchestrator.sync import sync_workflows
from orchestrator.web import grid, svg
from orchestrator.web.runs import run_context
from orchestrator.web.timeline import Axis

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


# --- the grid's bars --------------------------------------------------------------------------


def test_a_bar_is_its_share_of_the_longest_task_run():
    assert grid.bar(40.0, longest=40.0) == (0, 24)
    assert grid.bar(10.0, longest=40.0) == (18, 6)
    assert grid.bar(20.0, longest=40.0) == (12, 12)


def test_a_bar_too_short_to_see_still_shows_and_one_that_never_started_has_none():
    assert grid.bar(0.01, longest=3600.0) == (21, 3)  # at least three pixels
    assert grid.bar(0.0, longest=0.0) == (21, 3)  # nothing took any time: no share to divide
    assert grid.bar(None, longest=40.0) == (24, 0)  # waiting, upstream failed: the cell's colour alone


# --- the grid's pages, from a workflow and the time ----------------------------------------------


@pytest.fixture
def etl(db):
    sync_workflows()
    return Workflow.objects.select_related("current_version").get(name="nightly_etl")


def run_at(wf, logical_date: datetime, seconds: float) -> Run:
    run, _ = create_run(wf, trigger="manual", logical_date=logical_date)
    Run.objects.filter(pk=run.pk).update(state=RunState.SUCCEEDED, started_at=logical_date,
                                         finished_at=logical_date + timedelta(seconds=seconds))
    TaskRun.objects.filter(run=run).update(state=TaskState.SUCCEEDED, attempts=1, started_at=logical_date,
                                           finished_at=logical_date + timedelta(seconds=seconds))
    return run


def test_the_grid_pages_back_by_logical_date_and_scales_bars_to_the_page_shown(etl):
    # Made newest first: the columns follow the logical date, not the id.
    runs = [run_at(etl, T0 - timedelta(days=day), seconds=10.0 * (day + 1)) for day in range(5)]
    upstream = svg.upstream_of(etl.spec)
    newest = grid.grid_context(etl, upstream, T0, size=2)
    assert [run.pk for run in newest["runs"]] == [runs[1].pk, runs[0].pk]
    assert newest["grid_older"] == f"runs=2&before={runs[1].pk}" and not newest["grid_paged"]
    # The longest task run on this page (20 s) is the full height; the 10 s one half of it.
    heights = {run.pk: {cell.bar_h for row in newest["grid_rows"] for r, cell in row.cells if r.pk == run.pk}
               for run in newest["runs"]}
    assert heights == {runs[1].pk: {24}, runs[0].pk: {12}}

    older = grid.grid_context(etl, upstream, T0, size=2, before=runs[1].pk)
    assert [run.pk for run in older["runs"]] == [runs[3].pk, runs[2].pk]
    assert older["grid_paged"] and older["grid_query"] == f"runs=2&before={runs[1].pk}"
    oldest = grid.grid_context(etl, upstream, T0, size=2, before=runs[3].pk)
    assert [run.pk for run in oldest["runs"]] == [runs[4].pk] and oldest["grid_older"] is None
    # Every task of the graph is a row, in the graph's order.
    assert [row.name for row in newest["grid_rows"]] == svg.task_order(upstream)


# --- the run page's timeline -------------------------------------------------------------------


def test_the_axis_spans_every_interval_and_an_unfinished_one_runs_until_now():
    axis = Axis.over([(T0, T0 + timedelta(seconds=30)), (T0 + timedelta(seconds=10), None)],
                     now=T0 + timedelta(seconds=100))
    assert axis.start == T0 and axis.length == 100.0
    assert axis.bar(T0 + timedelta(seconds=10), 90.0) == {"left": 10.0, "width": 90.0, "seconds": 90.0}


def test_an_axis_with_nothing_started_or_no_time_taken_still_divides():
    assert Axis.over([], now=T0) == Axis(None, 0.001)
    axis = Axis.over([(T0, T0)], now=T0)
    assert axis.length == 0.001
    # An instant is still a visible sliver.
    assert axis.bar(T0, 0.0) == {"left": 0.0, "width": 0.4, "seconds": 0.0}


def test_the_run_page_puts_each_attempt_on_one_axis_and_a_running_one_until_now(etl):
    run, _ = create_run(etl, trigger="manual")
    extract = TaskRun.objects.get(run=run, task="extract")
    Attempt.objects.create(task_run=extract, number=1, started_at=T0, finished_at=T0 + timedelta(seconds=20),
                           outcome="failed")
    Attempt.objects.create(task_run=extract, number=2, started_at=T0 + timedelta(seconds=30), outcome="running")
    TaskRun.objects.filter(pk=extract.pk).update(state=TaskState.RUNNING, started_at=T0, attempts=2)
    run = Run.objects.select_related("version").get(pk=run.pk)

    context = run_context(run, now=T0 + timedelta(seconds=80))
    assert context["span_start"] == T0 and context["span"] == 80.0
    row = next(tr for tr in context["task_runs"] if tr.task == "extract")
    assert [(b["left"], b["width"], b["seconds"]) for b in row.bars] == [(0.0, 25.0, 20.0), (37.5, 62.5, 50.0)]
    assert row.seconds == 80.0
    # Nothing else started: no bars, and the rows follow the graph's order.
    assert all(tr.bars == [] for tr in context["task_runs"] if tr.task != "extract")
    assert [tr.task for tr in context["task_runs"]] == svg.task_order(svg.upstream_of(run.version.spec))
    counts = dict(context["counts"])
    assert counts[TaskState.RUNNING] == 1 and sum(counts.values()) == TaskRun.objects.filter(run=run).count()
    # Later, the running attempt's bar has grown and the axis with it.
    later = run_context(run, now=T0 + timedelta(seconds=130))
    assert later["span"] == 130.0
