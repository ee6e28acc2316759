"""The Python API of the operator actions and backfills: each function takes its object as a model
instance, a primary key or (where it has one) a name, and an unknown one is named in the error."""

from datetime import UTC, datetime

import pytest

from orchestrator import backfill, control, cron
from orchestrator.models import Run, RunState, Schedule, TaskRun, TaskState, Workflow, WorkflowVersion
from orchestrator.runs import create_run

pytestmark = pytest.mark.django_db

TASKS = {"extract": {"kind": "python", "ref": "workflows.jobs:noop", "upstream": []}}


def make_workflow(name):
    workflow = Workflow.objects.create(name=name)
    workflow.current_version = WorkflowVersion.objects.create(
        workflow=workflow, number=1, hash=f"{name}-1", spec={"params": {}, "tasks": TASKS})
    workflow.save()
    return workflow


def make_schedule(workflow, name, now):
    return Schedule.objects.create(workflow=workflow, name=name, cron="0 * * * *", timezone="UTC",
                                   next_fire_at=cron.next_fire_time("0 * * * *", "UTC", now))


def paused(model, pk):
    return model.objects.values_list("paused", flat=True).get(pk=pk)


@pytest.mark.parametrize("how", ["instance", "pk", "name"])
def test_a_workflow_is_paused_and_resumed_by_instance_primary_key_or_name(how):
    workflow = make_workflow("maintenance")
    ref = {"instance": workflow, "pk": workflow.pk, "name": "maintenance"}[how]
    assert control.pause_workflow(ref).pk == workflow.pk
    assert paused(Workflow, workflow.pk) is True
    assert control.resume_workflow(ref).paused is False
    assert paused(Workflow, workflow.pk) is False


@pytest.mark.parametrize("how", ["instance", "pk", "name with its workflow", "unique name"])
def test_a_schedule_is_paused_and_resumed_by_instance_primary_key_or_name(clock, how):
    workflow = make_workflow("etl")
    schedule = make_schedule(workflow, "hourly", clock.now())
    make_schedule(workflow, "other", clock.now())
    args, kwargs = {
        "instance": ((schedule,), {}),
        "pk": ((schedule.pk,), {}),
        "name with its workflow": (("hourly",), {"workflow": "etl"}),
        "unique name": (("hourly",), {}),
    }[how]
    assert control.pause_schedule(*args, **kwargs).pk == schedule.pk
    assert paused(Schedule, schedule.pk) is True
    assert paused(Schedule, Schedule.objects.get(name="other").pk) is False
    assert control.resume_schedule(*args, **kwargs, now=clock.now()).paused is False
    assert paused(Schedule, schedule.pk) is False


def test_unknown_or_ambiguous_objects_are_named_in_the_error(clock):
    etl, other = make_workflow("etl"), make_workflow("reports")
    make_schedule(etl, "daily", clock.now())
    make_schedule(other, "daily", clock.now())
    with pytest.raises(control.NotFound, match=r"unknown workflow 'nope' \(known: etl, reports\)") as err:
        control.pause_workflow("nope")
    assert err.value.field == "workflow"
    with pytest.raises(control.NotFound, match="no workflow 999999"):
        control.resume_workflow(999999)
    with pytest.raises(control.NotFound, match=r"several workflows have a schedule 'daily'.*workflow="):
        control.pause_schedule("daily")
    with pytest.raises(control.NotFound, match=r"workflow 'etl' has no schedule 'weekly' \(its schedules: daily\)"):
        control.pause_schedule("weekly", workflow=etl)
    with pytest.raises(TypeError, match="expected an instance, a primary key or a name of Workflow"):
        control.pause_workflow(1.5)
    with pytest.raises(TypeError, match="expected an instance or a primary key of Run"):
        control.cancel_run("42")
    # nothing was paused by the failed calls
    assert not Workflow.objects.filter(paused=True).exists()
    assert not Schedule.objects.filter(paused=True).exists()


@pytest.mark.parametrize("how", ["instance", "pk"])
def test_runs_are_cancelled_and_retried_by_instance_or_primary_key(clock, how):
    workflow = make_workflow("etl")
    run, _ = create_run(workflow, trigger="manual", now=clock.now())
    assert control.cancel_run(run if how == "instance" else run.pk, reason="stop") is True
    assert Run.objects.get(pk=run.pk).state == RunState.CANCELLED
    assert control.retry_run(run if how == "instance" else run.pk, now=clock.now()) == 0  # cancelled: not retried

    failed, _ = create_run(workflow, trigger="manual", now=clock.now())
    Run.objects.filter(pk=failed.pk).update(state=RunState.FAILED, finished_at=clock.now())
    TaskRun.objects.filter(run=failed).update(state=TaskState.DEAD, finished_at=clock.now())
    task_run = TaskRun.objects.get(run=failed)
    assert control.retry_task_runs([task_run if how == "instance" else task_run.pk], now=clock.now()) == 1
    assert Run.objects.get(pk=failed.pk).state == RunState.RUNNING


@pytest.mark.parametrize("how", ["instance", "pk", "name"])
def test_a_backfill_takes_its_workflow_and_schedule_by_instance_primary_key_or_name(clock, how):
    workflow = make_workflow("etl")
    schedule = make_schedule(workflow, "hourly", clock.now())
    start = datetime(2026, 1, 1, 0, tzinfo=UTC)
    end = datetime(2026, 1, 1, 2, tzinfo=UTC)
    ref = {"instance": workflow, "pk": workflow.pk, "name": "etl"}[how]
    chosen = {"instance": schedule, "pk": schedule.pk, "name": "hourly"}[how]
    the_plan = backfill.plan(ref, start, end, schedule=chosen)
    assert (the_plan.workflow.pk, the_plan.schedule.pk, the_plan.count) == (workflow.pk, schedule.pk, 3)
    created = backfill.start(ref, start, end, schedule=chosen, now=clock.now())
    assert backfill.progress(created if how == "instance" else created.pk) == (0, 3)
    with pytest.raises(backfill.BackfillError, match="unknown workflow 'nope'"):
        backfill.plan("nope", start, end)
    with pytest.raises(backfill.BackfillError, match="has no schedule with primary key 999999"):
        backfill.plan(ref, start, end, schedule=999999)
