"""The scheduler's tick on a real PostgreSQL with an injected clock: cron to runs, the missed-run,
start-deadline, overlap and max-active-runs policies, jitter, pause/resume and the lease."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from orchestrator import cron
from orchestrator.control import pause_schedule, pause_workflow, resume_schedule, resume_workflow
from orchestrator.lease import LeaderLease
from orchestrator.models import Run, RunState, Schedule, TaskRun, TaskState, Workflow, WorkflowVersion
from orchestrator.runs import trigger_workflow
from orchestrator.scheduler import Scheduler

pytestmark = pytest.mark.django_db

TASKS = {
    "extract": {"kind": "python", "ref": "workflows.jobs:noop", "upstream": []},
    "load": {"kind": "python", "ref": "workflows.jobs:noop", "upstream": ["extract"]},
}


def at(hour, minute=0, second=0, day=2):
    return datetime(2026, 3, day, hour, minute, second, tzinfo=UTC)


def make_workflow(name="etl", *, max_active_runs=None, params=None):
    workflow = Workflow.objects.create(name=name, max_active_runs=max_active_runs)
    version = WorkflowVersion.objects.create(
        workflow=workflow, number=1, hash=f"{name}-1", spec={"params": params or {}, "tasks": TASKS})
    workflow.current_version = version
    workflow.save()
    return workflow


def make_schedule(workflow, expr="0 * * * *", *, now, tz="UTC", name="default", **options):
    return Schedule.objects.create(workflow=workflow, name=name, cron=expr, timezone=tz,
                                   next_fire_at=cron.next_fire_time(expr, tz, now), **options)


def scheduler(clock, **options):
    return Scheduler(clock=clock, holder="test-scheduler", maintenance=[], **options)


def runs_of(schedule):
    return list(Run.objects.filter(schedule=schedule).order_by("logical_date"))


def finish(run, state=RunState.SUCCEEDED):
    Run.objects.filter(pk=run.pk).update(state=state, finished_at=at(23))
    TaskRun.objects.filter(run=run).update(state=TaskState.SUCCEEDED)


@pytest.fixture
def workflow():
    return make_workflow()


# -- cron to runs ------------------------------------------------------------------------------


def test_it_creates_one_run_per_fire_time_with_its_first_tasks_due(clock, workflow):
    schedule = make_schedule(workflow, now=clock.now())  # 09:00 now, first fire 10:00
    ticker = scheduler(clock)
    clock.set(at(9, 30))
    assert ticker.tick() is False
    assert Run.objects.count() == 0

    clock.set(at(10, 0, 2))
    assert ticker.tick() is True
    [run] = runs_of(schedule)
    assert (run.logical_date, run.trigger, run.state) == (at(10), "schedule", RunState.RUNNING)
    tasks = {t.task: t for t in run.task_runs.all()}
    assert tasks["extract"].state == TaskState.SCHEDULED and tasks["extract"].due_at == at(10)
    assert tasks["load"].state == TaskState.WAITING and tasks["load"].due_at is None
    assert (tasks["load"].spec, tasks["load"].upstream) == (TASKS["load"], ["extract"])
    with connection.cursor() as cursor:  # stored as JSON objects and arrays, not as strings
        cursor.execute("SELECT jsonb_typeof(spec), cardinality(upstream) FROM orchestrator_taskrun"
                       " WHERE run_id = %s AND task = 'load'", [run.pk])
        assert cursor.fetchone() == ("object", 1)
    assert Run.objects.filter(params={}, pk=run.pk).exists()
    schedule.refresh_from_db()
    assert (schedule.next_fire_at, schedule.last_fire_at) == (at(11), at(10))

    # A second tick in the same second finds nothing due: nothing is recorded twice.
    assert ticker.tick() is False
    assert len(runs_of(schedule)) == 1


def test_a_fire_time_inserted_by_another_scheduler_is_not_duplicated(clock, workflow):
    schedule = make_schedule(workflow, now=clock.now())
    clock.set(at(10, 0, 1))
    # Another scheduler that also believed it led already inserted this fire time but had not
    # advanced the schedule: the unique constraint turns the second insert into a no-op.
    Run.objects.create(workflow=workflow, version=workflow.current_version, schedule=schedule,
                       logical_date=at(10), trigger="schedule")
    scheduler(clock, use_lease=False).tick()
    assert [r.logical_date for r in runs_of(schedule)] == [at(10)]
    assert TaskRun.objects.count() == 0  # the existing run's tasks are not inserted again
    schedule.refresh_from_db()
    assert schedule.next_fire_at == at(11)


def test_it_handles_more_due_schedules_than_one_batch(clock, workflow):
    schedules = [make_schedule(workflow, now=clock.now(), name=f"s{i}") for i in range(23)]
    clock.set(at(10, 0, 1))
    scheduler(clock, batch_size=5).tick()
    assert Run.objects.filter(logical_date=at(10)).count() == 23
    assert TaskRun.objects.count() == 46
    assert set(Schedule.objects.values_list("next_fire_at", flat=True)) == {at(11)}
    assert all(len(runs_of(s)) == 1 for s in schedules)


def test_paused_removed_and_versionless_workflows_do_not_fire(clock, workflow):
    paused = make_workflow("paused")
    Workflow.objects.filter(pk=paused.pk).update(paused=True)
    removed = make_workflow("removed")
    Workflow.objects.filter(pk=removed.pk).update(present=False)
    versionless = Workflow.objects.create(name="never-synced")
    for wf in (paused, removed, versionless):
        make_schedule(wf, now=clock.now())
    paused_schedule = make_schedule(workflow, now=clock.now(), paused=True)
    clock.set(at(10, 0, 1))
    scheduler(clock).tick()
    assert Run.objects.count() == 0
    paused_schedule.refresh_from_db()
    assert paused_schedule.next_fire_at == at(10)  # still due: resuming applies the catchup policy


def test_invalid_schedule_params_are_recorded_as_a_skipped_run(clock):
    workflow = make_workflow(params={"n": {"type": "int", "required": True}})
    schedule = make_schedule(workflow, now=clock.now(), params={"n": "many"})
    clock.set(at(10, 0, 1))
    scheduler(clock).tick()
    [run] = runs_of(schedule)
    assert run.state == RunState.SKIPPED
    assert "params are invalid" in run.reason and "n: expected an integer" in run.reason
    assert run.task_runs.count() == 0


def test_schedule_params_are_cleaned_into_the_run(clock):
    workflow = make_workflow(params={"n": {"type": "int", "required": False, "default": 1},
                                     "mode": {"type": "str", "required": False, "default": "full"}})
    schedule = make_schedule(workflow, now=clock.now(), params={"n": "7"})
    clock.set(at(10, 0, 1))
    scheduler(clock).tick()
    assert runs_of(schedule)[0].params == {"n": 7, "mode": "full"}


# -- missed runs (catchup) ------------------------------------------------------------------------


def test_catchup_latest_runs_only_the_most_recent_missed_fire_time_and_records_the_others(clock, workflow):
    schedule = make_schedule(workflow, now=clock.now())  # catchup defaults to latest
    clock.set(at(13, 30))  # down from before 10:00 until 13:30
    scheduler(clock).tick()
    runs = runs_of(schedule)
    assert [(r.logical_date, r.state) for r in runs] == [
        (at(10), RunState.SKIPPED), (at(11), RunState.SKIPPED), (at(12), RunState.SKIPPED),
        (at(13), RunState.RUNNING),
    ]
    # every fire time is accounted for, with the reason
    assert all(r.reason == "missed: catchup=latest runs only the most recent missed fire time "
                           "(2026-03-02 13:00:00 UTC)" for r in runs[:3])
    assert all(r.task_runs.count() == 0 and r.finished_at == at(13, 30) for r in runs[:3])
    schedule.refresh_from_db()
    assert (schedule.next_fire_at, schedule.last_fire_at) == (at(14), at(13))


def test_catchup_none_runs_the_current_fire_time_and_records_the_late_ones_as_skipped(clock, workflow):
    schedule = make_schedule(workflow, now=clock.now(), catchup="none")
    ticker = scheduler(clock)
    clock.set(at(13, 30))
    ticker.tick()
    runs = runs_of(schedule)
    assert [(r.logical_date, r.state) for r in runs] == [(at(h), RunState.SKIPPED) for h in (10, 11, 12, 13)]
    assert runs[-1].reason == ("the scheduler reached this fire time 1800s late, and catchup=none runs no "
                               "fire time reached more than 60s late")
    schedule.refresh_from_db()
    assert schedule.next_fire_at == at(14)

    clock.set(at(14, 0, 20))  # on time (a scheduler is never exactly at the second)
    ticker.tick()
    assert [(r.logical_date, r.state) for r in runs_of(schedule)][-1] == (at(14), RunState.RUNNING)


def test_catchup_all_runs_every_missed_fire_time_up_to_the_cap_and_records_the_rest_as_skipped(clock, workflow):
    schedule = make_schedule(workflow, now=clock.now(), catchup="all", max_catchup=2)
    clock.set(at(14, 30))  # 10, 11, 12, 13 and 14 o'clock were missed
    scheduler(clock).tick()
    runs = runs_of(schedule)
    assert [(r.logical_date.hour, r.state) for r in runs] == [
        (10, RunState.SKIPPED), (11, RunState.SKIPPED), (12, RunState.SKIPPED),
        (13, RunState.RUNNING), (14, RunState.RUNNING),
    ]
    assert all("catchup limit of 2" in r.reason for r in runs[:3])
    assert all(r.task_runs.count() == 0 for r in runs[:3])
    assert all(r.task_runs.count() == 2 for r in runs[3:])


def test_catchup_all_uses_the_configured_default_cap(clock, workflow, settings):
    settings.ORCHESTRATOR_MAX_CATCHUP_RUNS = 3
    schedule = make_schedule(workflow, "*/10 * * * *", now=clock.now(), catchup="all")
    clock.set(at(10, 0))  # 09:10 ... 10:00: six fire times
    scheduler(clock).tick()
    states = [r.state for r in runs_of(schedule)]
    assert states == [RunState.SKIPPED] * 3 + [RunState.RUNNING] * 3


@pytest.mark.parametrize("catchup", ["latest", "all"])
def test_a_schedule_overdue_for_a_year_only_looks_at_its_most_recent_fire_times(clock, workflow, caplog, catchup):
    # Every second for 400 days is 34 million fire times; the tick must not walk them all.
    schedule = make_schedule(workflow, "* * * * * *", now=clock.now() - timedelta(days=400), catchup=catchup,
                             max_catchup=2)
    clock.set(at(10, 0, 0))
    scheduler(clock).tick()
    runs = runs_of(schedule)
    started = [r.logical_date for r in runs if r.state == RunState.RUNNING]
    skipped = [r for r in runs if r.state == RunState.SKIPPED]
    # The most recent fire times passed over get a row each (up to MAX_SKIPPED_RECORDS), the
    # older ones of the gap one summary row at the first fire time not handled.
    summary, recorded = skipped[0], skipped[1:]
    assert summary.logical_date == datetime(2025, 1, 26, 9, 0, 1, tzinfo=UTC)  # the first fire time not handled
    assert len(recorded) == 1000 and len(runs) == 1 + 1000 + (1 if catchup == "latest" else 2)
    if catchup == "latest":
        assert started == [at(10)]
        assert recorded[0].logical_date == at(9, 43, 20) and recorded[-1].logical_date == at(9, 59, 59)
        first_recorded = "2026-03-02 09:43:20 UTC"
    else:
        assert started == [at(9, 59, 59), at(10)]
        assert recorded[0].logical_date == at(9, 43, 19) and recorded[-1].logical_date == at(9, 59, 58)
        first_recorded = "2026-03-02 09:43:19 UTC"
    assert summary.reason.startswith(f"more than a thousand fire times from 2025-01-26 09:00:01 UTC until before "
                                     f"{first_recorded} were not run: ")
    assert summary.reason.endswith("this one row stands for all of them")
    schedule.refresh_from_db()
    assert schedule.next_fire_at == at(10, 0, 1)


# -- start deadline -------------------------------------------------------------------------------


def test_a_fire_time_reached_after_its_start_deadline_is_recorded_as_missed(clock, workflow):
    schedule = make_schedule(workflow, now=clock.now(), catchup="all", start_deadline=600)
    clock.set(at(11, 5))  # 10:00 is 65 minutes late, 11:00 five minutes
    scheduler(clock).tick()
    missed, on_time = runs_of(schedule)
    assert (missed.logical_date, missed.state) == (at(10), RunState.MISSED)
    assert "start deadline of 600s" in missed.reason and "3900s late" in missed.reason
    assert missed.task_runs.count() == 0
    assert (on_time.logical_date, on_time.state) == (at(11), RunState.RUNNING)


def test_a_run_whose_first_task_has_not_started_by_its_deadline_is_missed_and_its_tasks_cancelled(clock, workflow):
    schedule = make_schedule(workflow, now=clock.now(), start_deadline=300)
    ticker = scheduler(clock)
    clock.set(at(10, 0, 1))
    ticker.tick()
    [run] = runs_of(schedule)
    clock.set(at(10, 4))
    ticker.tick()
    run.refresh_from_db()
    assert run.state == RunState.RUNNING  # still within its deadline

    clock.set(at(10, 5, 1))
    ticker.tick()
    run.refresh_from_db()
    assert run.state == RunState.MISSED
    assert "start deadline of 300s" in run.reason
    assert set(run.task_runs.values_list("state", flat=True)) == {TaskState.CANCELLED}


def test_a_run_that_started_in_time_is_not_missed_later(clock, workflow):
    schedule = make_schedule(workflow, now=clock.now(), start_deadline=300)
    ticker = scheduler(clock)
    clock.set(at(10, 0, 1))
    ticker.tick()
    [run] = runs_of(schedule)
    TaskRun.objects.filter(run=run, task="extract").update(state=TaskState.RUNNING, started_at=at(10, 1))
    clock.set(at(10, 30))
    ticker.tick()
    run.refresh_from_db()
    assert run.state == RunState.RUNNING


# -- overlap --------------------------------------------------------------------------------------


def test_overlap_allow_lets_runs_of_one_schedule_overlap(clock, workflow):
    schedule = make_schedule(workflow, now=clock.now(), overlap="allow")
    ticker = scheduler(clock)
    for hour in (10, 11):
        clock.set(at(hour, 0, 1))
        ticker.tick()
    assert [r.state for r in runs_of(schedule)] == [RunState.RUNNING, RunState.RUNNING]


def test_overlap_forbid_records_the_new_fire_time_as_skipped_while_the_previous_run_is_active(clock, workflow):
    schedule = make_schedule(workflow, now=clock.now(), overlap="forbid")
    ticker = scheduler(clock)
    clock.set(at(10, 0, 1))
    ticker.tick()
    [first] = runs_of(schedule)
    clock.set(at(11, 0, 1))
    ticker.tick()
    second = runs_of(schedule)[1]
    assert second.state == RunState.SKIPPED
    assert second.reason == f"run #{first.pk} is still running (overlap=forbid)"
    assert second.task_runs.count() == 0

    finish(first)
    clock.set(at(12, 0, 1))
    ticker.tick()
    assert runs_of(schedule)[2].state == RunState.RUNNING


def test_overlap_buffer_one_keeps_one_waiting_run_and_starts_it_when_the_active_one_ends(clock, workflow):
    schedule = make_schedule(workflow, now=clock.now(), overlap="buffer_one")
    ticker = scheduler(clock)
    for hour in (10, 11, 12):
        clock.set(at(hour, 0, 1))
        ticker.tick()
    first, buffered, dropped = runs_of(schedule)
    assert first.state == RunState.RUNNING
    assert buffered.state == RunState.PENDING
    # A pending run holds all its tasks back.
    assert set(buffered.task_runs.values_list("state", flat=True)) == {TaskState.WAITING}
    assert dropped.state == RunState.SKIPPED and "overlap=buffer_one" in dropped.reason

    clock.set(at(12, 10))
    ticker.tick()
    buffered.refresh_from_db()
    assert buffered.state == RunState.PENDING  # the first run is still active

    finish(first)
    clock.set(at(12, 20))
    ticker.tick()
    buffered.refresh_from_db()
    assert buffered.state == RunState.RUNNING
    root = buffered.task_runs.get(task="extract")
    assert (root.state, root.due_at) == (TaskState.SCHEDULED, at(12, 20))


# -- max active runs ------------------------------------------------------------------------------


def test_max_active_runs_holds_new_runs_back_until_there_is_room(clock):
    workflow = make_workflow(max_active_runs=2)
    schedules = [make_schedule(workflow, now=clock.now(), name=f"s{i}") for i in range(3)]
    ticker = scheduler(clock)
    clock.set(at(10, 0, 1))
    ticker.tick()
    runs = list(Run.objects.order_by("schedule__name"))
    assert [r.state for r in runs] == [RunState.RUNNING, RunState.RUNNING, RunState.PENDING]
    assert "max_active_runs (2)" in runs[2].reason

    # A manual trigger queues behind the pending one rather than jumping the limit.
    manual, _ = trigger_workflow(workflow, {}, now=at(10, 1))
    assert manual.state == RunState.PENDING

    finish(runs[0])
    clock.set(at(10, 2))
    ticker.tick()
    states = dict(Run.objects.values_list("pk", "state"))
    assert states[runs[2].pk] == RunState.RUNNING  # the oldest waiting run goes first
    assert states[manual.pk] == RunState.PENDING
    assert Run.objects.filter(state=RunState.RUNNING).count() == 2
    assert len(schedules) == 3


# -- jitter ---------------------------------------------------------------------------------------


def test_jitter_spreads_first_tasks_by_a_stable_bounded_offset_and_keeps_the_logical_date(clock, workflow):
    schedules = [make_schedule(workflow, now=clock.now(), name=f"s{i}", jitter=120) for i in range(20)]
    ticker = scheduler(clock)
    offsets = {}
    for hour in (10, 11):
        clock.set(at(hour, 0, 1))
        ticker.tick()
        for schedule in schedules:
            run = Run.objects.get(schedule=schedule, logical_date=at(hour))
            root = run.task_runs.get(task="extract")
            offset = (root.due_at - at(hour)).total_seconds()
            assert 0 <= offset <= 120
            assert offset == cron.jitter_offset(str(schedule.pk), 120)
            offsets.setdefault(schedule.pk, set()).add(offset)
    assert all(len(seen) == 1 for seen in offsets.values())  # stable per schedule
    assert len({next(iter(seen)) for seen in offsets.values()}) > 10  # and spread across schedules


# -- pause and resume -----------------------------------------------------------------------------


@pytest.mark.parametrize(("catchup", "expected"), [
    ("latest", [13]),
    ("all", [10, 11, 12, 13]),
    ("none", []),
])
def test_resuming_a_schedule_applies_its_missed_run_policy(clock, workflow, catchup, expected):
    schedule = make_schedule(workflow, now=clock.now(), catchup=catchup)
    ticker = scheduler(clock)
    pause_schedule(schedule)
    clock.set(at(13, 30))
    ticker.tick()
    assert runs_of(schedule) == []

    resume_schedule(schedule, now=clock.now())
    ticker.tick()
    runs = runs_of(schedule)
    assert [r.logical_date.hour for r in runs if r.state == RunState.RUNNING] == expected
    # the fire times passed while paused are each a run or a recorded skipped run
    assert [r.logical_date.hour for r in runs] == [10, 11, 12, 13]
    assert all(r.reason for r in runs if r.state == RunState.SKIPPED)
    schedule.refresh_from_db()
    assert (schedule.paused, schedule.next_fire_at) == (False, at(14))


def test_pausing_a_workflow_stops_all_its_schedules_and_resuming_catches_up(clock, workflow):
    hourly = make_schedule(workflow, now=clock.now(), name="hourly", catchup="all")
    daily = make_schedule(workflow, "0 12 * * *", now=clock.now(), name="daily")
    ticker = scheduler(clock)
    pause_workflow(workflow)
    clock.set(at(12, 30))
    ticker.tick()
    assert Run.objects.count() == 0
    resume_workflow(workflow)
    ticker.tick()
    assert [r.logical_date.hour for r in runs_of(hourly)] == [10, 11, 12]
    assert [r.logical_date.hour for r in runs_of(daily)] == [12]


# -- the lease ------------------------------------------------------------------------------------


def test_only_the_lease_holder_creates_runs_and_a_deposed_leader_writes_nothing(clock, workflow):
    schedule = make_schedule(workflow, now=clock.now())
    leader, standby = scheduler(clock), Scheduler(clock=clock, holder="standby", maintenance=[])
    clock.set(at(10, 0, 1))
    assert leader.tick() is True
    assert standby.tick() is False

    # The leader stalls past its lease; the standby takes over.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE orchestrator_lease SET expires_at = clock_timestamp() - interval '1 second'")
    clock.set(at(11, 0, 1))
    assert standby.tick() is True
    clock.set(at(12, 0, 1))
    # The old leader still has its epoch in memory, but its renewal and fence both fail.
    leader.lease._renewed_at = 0
    assert leader.tick() is False
    assert [r.logical_date.hour for r in runs_of(schedule)] == [10, 11]
    assert leader.lease.is_leader is False


def test_a_leader_whose_lease_lapsed_mid_tick_stops_before_writing(clock, workflow):
    schedule = make_schedule(workflow, now=clock.now())
    leader = scheduler(clock)
    assert leader.lease.ensure()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE orchestrator_lease SET expires_at = clock_timestamp() - interval '1 second'")
    LeaderLease(holder="other").acquire()
    clock.set(at(10, 0, 1))
    # ensure() sees a fresh renewal time and trusts its lease; the fence in the write transaction
    # is what stops it.
    assert leader.tick() is False
    assert runs_of(schedule) == []
    schedule.refresh_from_db()
    assert schedule.next_fire_at == at(10)


# -- maintenance ----------------------------------------------------------------------------------


def test_maintenance_runs_on_the_leader_at_its_interval_and_a_failure_does_not_stop_the_scheduler(
        clock, workflow, caplog):
    calls = []

    def broken(clock_):
        calls.append(("broken", clock_.now()))
        raise RuntimeError("disk full")

    def fine(clock_):
        calls.append(("fine", clock_.now()))

    jobs = [("broken", 5, broken), ("fine", 60, fine)]
    leader = Scheduler(clock=clock, holder="leader", maintenance=jobs)
    standby = Scheduler(clock=clock, holder="standby", maintenance=jobs)
    schedule = make_schedule(workflow, now=clock.now())
    for seconds in (0, 2, 6):
        clock.set(at(9, 59, 55) + timedelta(seconds=seconds))
        leader.tick()
        standby.tick()
    assert calls == [("broken", at(9, 59, 55)), ("fine", at(9, 59, 55)), ("broken", at(10, 0, 1))]
    assert "maintenance job broken failed" in caplog.text and "disk full" in caplog.text
    assert [r.logical_date for r in runs_of(schedule)] == [at(10)]  # it kept scheduling
