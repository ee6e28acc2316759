"""Overlap "replace": the active run is cancelled through the control module, then the new run
starts."""

import pytest

from orchestrator.models import RunState, TaskState
from tests.test_scheduler import at, make_schedule, make_workflow, runs_of, scheduler

pytestmark = pytest.mark.django_db


def test_overlap_replace_cancels_the_active_run_and_starts_the_new_one(clock):
    workflow = make_workflow()
    schedule = make_schedule(workflow, now=clock.now(), overlap="replace")
    ticker = scheduler(clock)
    clock.set(at(10, 0, 1))
    ticker.tick()
    [first] = runs_of(schedule)
    clock.set(at(11, 0, 1))
    ticker.tick()
    first.refresh_from_db()
    second = runs_of(schedule)[1]
    assert first.state == RunState.CANCELLED
    assert "replaced by the run of 2026-03-02 11:00:00 UTC" in first.reason
    assert set(first.task_runs.values_list("state", flat=True)) == {TaskState.CANCELLED}
    assert second.state == RunState.RUNNING
    assert second.task_runs.get(task="extract").state == TaskState.SCHEDULED
