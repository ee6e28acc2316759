# ruff: noqa: F811 - pytest fixtures imported from tests.support.api_support
"""Admission (orchestrator/admission.py): every creator of runs follows one max_active_runs rule.
A run starts at once when the workflow has room for it after the runs waiting ahead of it (first
come, first started; a run held by its schedule's overlap policy waits for its schedule, not for
room); otherwise it waits, pending. Backfills count and wait too, behind live runs."""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections, transaction

from orchestrator import admission, backfill, cron, datasets
from orchestrator.models import Dataset, DatasetEvent, Run, Schedule, TaskRun, Workflow, WorkflowVersion
from orchestrator.runs import trigger_workflow
from orchestrator.scheduler import Scheduler
from orchestrator.states import Lane, Overlap, RunState, TaskState, Trigger
from tests.conftest import wait_for
from tests.support.api_support import api, operator  # noqa: F401 - fixtures

TASKS = {
    "extract": {"kind": "python", "ref": "workflows.jobs:noop", "upstream": []},
    "load": {"kind": "python", "ref": "workflows.jobs:noop", "upstream": ["extract"]},
}
NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def make_workflow(max_active_runs=2) -> Workflow:
    workflow = Workflow.objects.create(name="limited", max_active_runs=max_active_runs)
    workflow.current_version = WorkflowVersion.objects.create(
        workflow=workflow, number=1, hash="limited-1",
        spec={"params": {}, "tasks": TASKS, "triggers": [{"datasets": ["orders"], "mode": "any"}]})
    workflow.save()
    return workflow


def make_schedule(workflow, name, now, **options) -> Schedule:
    # Hourly: the next fire time is the coming hour.
    return Schedule.objects.create(workflow=workflow, name=name, cron="0 * * * *", timezone="UTC",
                                   next_fire_at=cron.next_fire_time("0 * * * *", "UTC", now), **options)


def existing_run(workflow, state, *, at, schedule=None, lane=Lane.LIVE, trigger=Trigger.MANUAL) -> Run:
    """A run made by the test: running (its root task scheduled) or waiting (its tasks held)."""
    run = Run.objects.create(workflow=workflow, version=workflow.current_version, schedule=schedule, state=state,
                             logical_date=at, trigger=trigger, lane=lane)
    for name, spec in TASKS.items():
        root = state == RunState.RUNNING and not spec["upstream"]
        TaskRun.objects.create(run=run, task=name, spec=spec, upstream=spec["upstream"], lane=lane,
                               state=TaskState.SCHEDULED if root else TaskState.WAITING, due_at=at if root else None)
    return run


def finish(run):
    TaskRun.objects.filter(run=run).update(state=TaskState.SUCCEEDED, finished_at=NOW)
    Run.objects.filter(pk=run.pk).update(state=RunState.SUCCEEDED, finished_at=NOW)


def tick(clock):
    return Scheduler(clock=clock, holder="test", maintenance=[]).tick()


def newest(**filters) -> Run:
    return Run.objects.filter(**filters).latest("id")


# --- the five ways a run of a workflow is made, each returning the run it made ---------------------

def by_hand(workflow, clock, api):
    run, _ = trigger_workflow(workflow, {}, trigger=Trigger.MANUAL, now=clock.now())
    return run


def by_api(workflow, clock, api):
    response = api.post(f"/api/workflows/{workflow.name}/runs/", {"params": {}}, format="json")
    assert response.status_code == 201, response.json()
    return Run.objects.get(pk=response.json()["id"])


def by_schedule(workflow, clock, api):
    make_schedule(workflow, "fires", clock.now())
    clock.set(clock.now().replace(minute=0) + timedelta(hours=1))
    tick(clock)
    return newest(trigger=Trigger.SCHEDULE)


def by_data(workflow, clock, api):
    event = DatasetEvent.objects.create(dataset=Dataset.objects.create(name="orders"), workflow="producer",
                                        logical_date=clock.now(), created_at=clock.now())
    with transaction.atomic():
        datasets.trigger_consumers(clock.now())
    return Run.objects.get(consumed_events__event=event)


def by_backfill(workflow, clock, api):
    day = datetime(2026, 2, 1, tzinfo=UTC)
    made = backfill.start(workflow, day, day, expr="0 0 * * *", now=clock.now())
    return made.runs.get()


PATHS = [by_hand, by_api, by_schedule, by_data, by_backfill]


# What is there when the new run comes (max_active_runs is 2), and what the rule makes of it.
SITUATIONS = {
    # Two running: no room.
    "full": (2, 0, 0, RunState.PENDING),
    # One running, one waiting for room: the room that is left is the waiting run's.
    "the_room_is_a_waiting_runs": (1, 1, 0, RunState.PENDING),
    # None running, one waiting: room for it and for the new run.
    "room_after_the_waiting_run": (0, 1, 0, RunState.RUNNING),
    # One running and one held by its schedule (buffer_one): that one waits for its schedule, not for room.
    "a_run_held_by_its_schedule_takes_no_room": (0, 0, 1, RunState.RUNNING),
}


@pytest.mark.django_db
@pytest.mark.parametrize("situation", SITUATIONS)
@pytest.mark.parametrize("make", [path for path in PATHS if path is not by_api],
                         ids=[path.__name__ for path in PATHS if path is not by_api])
def test_every_creator_of_runs_admits_a_run_by_one_rule(make, situation, clock, api):
    admitted_by_one_rule(make, situation, clock, api)


# The API's view reads the process clock: pinned, and at each instant of CI's clock pass.
@pytest.mark.django_db
@pytest.mark.time_sensitive
@pytest.mark.parametrize("situation", SITUATIONS)
def test_a_run_made_through_the_api_is_admitted_by_the_same_rule(situation, clock, api):
    admitted_by_one_rule(by_api, situation, clock, api)


def admitted_by_one_rule(make, situation, clock, api):
    running, waiting, held, expected = SITUATIONS[situation]
    workflow = make_workflow(max_active_runs=2)
    earlier = clock.now() - timedelta(days=3)
    for _ in range(running):
        existing_run(workflow, RunState.RUNNING, at=earlier)
    queued = [existing_run(workflow, RunState.PENDING, at=earlier) for _ in range(waiting)]
    if held:
        buffered = make_schedule(workflow, "buffered", clock.now(), overlap=Overlap.BUFFER_ONE, paused=True)
        existing_run(workflow, RunState.RUNNING, at=earlier, schedule=buffered, trigger=Trigger.SCHEDULE)
        existing_run(workflow, RunState.PENDING, at=earlier + timedelta(hours=1), schedule=buffered,
                     trigger=Trigger.SCHEDULE)

    run = make(workflow, clock, api)

    assert run.state == expected, run.reason
    if expected == RunState.PENDING:
        assert "max_active_runs (2)" in run.reason
        assert not TaskRun.objects.filter(run=run).exclude(state=TaskState.WAITING).exists()  # all held
    else:
        assert TaskRun.objects.get(run=run, task="extract").state == TaskState.SCHEDULED
    # However it was made, the runs that waited before it start before it, and never past the cap.
    tick(clock)
    assert all(Run.objects.get(pk=r.pk).state == RunState.RUNNING for r in queued)
    assert Run.objects.get(pk=run.pk).state == expected
    assert Run.objects.filter(workflow=workflow, state=RunState.RUNNING).count() == 2


@pytest.mark.django_db
def test_backfills_count_and_wait_behind_live_runs_which_start_in_the_order_they_came(clock):
    workflow = make_workflow(max_active_runs=2)
    first = datetime(2026, 2, 1, tzinfo=UTC)
    made = backfill.start(workflow, first, first + timedelta(days=2), expr="0 0 * * *", now=clock.now())
    backfills = list(made.runs.order_by("logical_date"))
    assert [r.state for r in backfills] == [RunState.RUNNING, RunState.RUNNING, RunState.PENDING]
    # The two running backfill runs fill the workflow: a live run waits, and so does the next one.
    manual = by_hand(workflow, clock, None)
    scheduled = by_schedule(workflow, clock, None)
    assert (manual.state, scheduled.state) == (RunState.PENDING, RunState.PENDING)

    order = []
    for done in backfills[:2] + [manual, scheduled]:
        finish(done)
        tick(clock)
        order += [r.pk for r in Run.objects.filter(workflow=workflow, state=RunState.RUNNING) if r.pk not in order]
    # Live runs first, the older first; the waiting backfill run once no live run waits.
    started = [pk for pk in order if pk not in {b.pk for b in backfills[:2]}]
    assert started == [manual.pk, scheduled.pk, backfills[2].pk]


@pytest.mark.django_db
def test_a_reprocessing_backfill_is_admitted_like_a_new_run(clock):
    workflow = make_workflow(max_active_runs=1)
    day = datetime(2026, 2, 1, tzinfo=UTC)
    made = backfill.start(workflow, day, day + timedelta(days=1), expr="0 0 * * *", now=clock.now())
    for run in made.runs.all():
        finish(run)
    again = backfill.start(workflow, day, day + timedelta(days=1), expr="0 0 * * *", reprocess="all", now=clock.now())
    states = dict(again.runs.values_list("logical_date", "state"))
    assert states == {day: RunState.RUNNING, day + timedelta(days=1): RunState.PENDING}
    waiting = again.runs.get(state=RunState.PENDING)
    assert "reprocessed by backfill" in waiting.reason and "max_active_runs (1)" in waiting.reason
    assert set(TaskRun.objects.filter(run=waiting).values_list("state", flat=True)) == {TaskState.WAITING}


@pytest.mark.django_db(transaction=True)
def test_two_triggers_at_once_cannot_both_take_the_last_place(clock):
    workflow = make_workflow(max_active_runs=1)
    decided, go_on = threading.Event(), threading.Event()
    made = {}

    def first():
        try:
            with transaction.atomic():
                made["first"] = by_hand(workflow, clock, None)
                decided.set()
                go_on.wait(30)
        finally:
            connection.close()

    def second():
        try:
            made["second"] = by_hand(workflow, clock, None)
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    assert decided.wait(30)
    threads[1].start()
    # The second trigger waits for the first one's decision to be committed.
    with connections["default"].cursor() as cursor:
        def waiting_for_the_lock():
            cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
            return cursor.fetchone()[0] == 1

        wait_for(waiting_for_the_lock, timeout=30, message="the second trigger to wait for admission's lock")
    go_on.set()
    for thread in threads:
        thread.join(30)
    assert (made["first"].state, made["second"].state) == (RunState.RUNNING, RunState.PENDING)


def rows_of_runs_read(action) -> int:
    """Rows of orchestrator_run that ``action`` read (sequentially or through an index), counted by
    PostgreSQL for the current transaction."""
    def read():
        with connection.cursor() as cursor:
            cursor.execute("SELECT COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables "
                           "WHERE relname = 'orchestrator_run'")
            return cursor.fetchone()[0]

    before = read()
    action()
    return read() - before


@pytest.mark.django_db
def test_admission_reads_the_same_rows_whatever_the_backlog_of_waiting_runs(clock):
    workflow = make_workflow(max_active_runs=2)
    for _ in range(2):
        existing_run(workflow, RunState.RUNNING, at=NOW)
    waiting = Run.objects.bulk_create([
        Run(workflow=workflow, version=workflow.current_version, state=RunState.PENDING, lane=Lane.BACKFILL,
            trigger=Trigger.BACKFILL, logical_date=NOW - timedelta(days=day)) for day in range(1, 4)])
    read = {}
    for backlog in ("small", "large"):
        with transaction.atomic():
            read[backlog] = (rows_of_runs_read(lambda: admission.Door([workflow]).admit(workflow, Lane.BACKFILL)),
                             rows_of_runs_read(admission.releasable))
            transaction.set_rollback(True)
        Run.objects.bulk_create([
            Run(workflow=workflow, version=workflow.current_version, state=RunState.PENDING, lane=Lane.BACKFILL,
                trigger=Trigger.BACKFILL, logical_date=NOW - timedelta(days=day)) for day in range(4, 2000)])
    # At 2,000 waiting runs it reads no more than the two running runs, at most max_active_runs
    # waiting ones and a probe per waiting workflow, as it may at 3 (where the planner may as well
    # scan the whole small table, a few rows more: not a cost that grows, so not compared).
    bound = (2 + 2, 2 + len(waiting))
    assert read["large"][0] <= bound[0] and read["large"][1] <= bound[1], read
