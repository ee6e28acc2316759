"""Backfills: one run per fire time of a workflow's schedule in a past (or future) range, in the
backfill lane so live work always goes first.

``plan()`` validates the request and lists the fire times without writing anything (the CLI's
``--dry-run`` and the admin's confirmation page); ``start()`` creates the runs; ``progress()``
counts the finished ones. The CLI (``manage.py backfill``), the admin and the API all go through
these three functions.

Fire times that already have a run are skipped, unless reprocessing: ``failed`` re-runs the
existing runs that ended without success (failed, cancelled, missed or skipped), ``all`` re-runs
every finished one. A re-run resets the existing run's task runs to a fresh start (each with a
fresh set of attempts; the old attempts stay in its history) instead of inserting a second run
for the same fire time. Active runs are never touched.

New and reprocessed runs alike are admitted like every run (``admission.py``): they count toward
the workflow's ``max_active_runs`` and, past it, wait in the backfill lane, behind live runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone as dj_timezone

from orchestrator import admission, clock, control, cron, retries
from orchestrator.channels import wake_due
from orchestrator.conf import app_settings
from orchestrator.limits import logical_date_error
from orchestrator.models import Backfill, Run, Schedule, TaskRun, Workflow
from orchestrator.params import ParamError, clean_params
from orchestrator.runs import NewRun, insert_runs, task_runs_for
from orchestrator.states import (
    FINISHED_RUN_STATES,
    FINISHED_TASK_STATES,
    Lane,
    RunState,
    TaskState,
    Trigger,
    sql_list,
)

REPROCESS_CHOICES = ("none", "failed", "all")
UNSUCCESSFUL_RUN_STATES = (RunState.FAILED, RunState.CANCELLED, RunState.MISSED, RunState.SKIPPED)
CHUNK = 500


class BackfillError(ValueError):
    """A backfill request that cannot be carried out; ``field`` names the input at fault."""

    def __init__(self, message: str, field: str = "non_field_errors"):
        self.field = field
        super().__init__(message)


@dataclass
class BackfillPlan:
    workflow: Workflow
    schedule: Schedule | None
    cron: str
    timezone: str
    start: datetime
    end: datetime
    reprocess: str
    fire_times: list[datetime]
    existing: list[datetime] = field(default_factory=list)  # fire times that already have a run
    to_create: list[datetime] = field(default_factory=list)  # fire times that get a new run
    to_reprocess: list[int] = field(default_factory=list)  # existing runs that will run again

    @property
    def count(self) -> int:
        return len(self.fire_times)

    @property
    def total(self) -> int:
        return len(self.to_create) + len(self.to_reprocess)


def _workflow(workflow) -> Workflow:
    try:
        return control.workflow_of(workflow)
    except control.NotFound as exc:
        raise BackfillError(str(exc), exc.field) from None


def _schedule(workflow: Workflow, schedule) -> Schedule | None:
    if isinstance(schedule, int) and not isinstance(schedule, bool):
        found = workflow.schedules.filter(pk=schedule).first()
        if found is None:
            raise BackfillError(f"workflow {workflow.name!r} has no schedule with primary key {schedule}", "schedule")
        return found
    if isinstance(schedule, Schedule):
        if schedule.workflow_id != workflow.pk:
            raise BackfillError(f"schedule {schedule.name!r} belongs to another workflow", "schedule")
        return schedule
    schedules = list(workflow.schedules.order_by("name"))
    names = ", ".join(s.name for s in schedules) or "none"
    if schedule:
        for candidate in schedules:
            if candidate.name == schedule:
                return candidate
        raise BackfillError(f"workflow {workflow.name!r} has no schedule {schedule!r} (its schedules: {names})",
                            "schedule")
    if len(schedules) == 1:
        return schedules[0]
    if not schedules:
        return None
    raise BackfillError(f"workflow {workflow.name!r} has {len(schedules)} schedules ({names}): choose one",
                        "schedule")


def _aware(value, name: str) -> datetime:
    if not isinstance(value, datetime):
        raise BackfillError(f"{name} must be a date and time, got {value!r}", name)
    if dj_timezone.is_naive(value):
        raise BackfillError(f"{name} {value.isoformat()} has no timezone; add one (e.g. +00:00)", name)
    return value


def plan(workflow, start, end, *, schedule=None, reprocess: str = "none", expr: str | None = None,
         timezone: str = "UTC") -> BackfillPlan:
    """Validate a backfill and list its fire times in [start, end] (both included); writes nothing.

    ``workflow`` is a Workflow, its primary key or its name; ``schedule`` (a Schedule, its primary
    key or its name) defaults to the workflow's only schedule; a workflow
    without one needs ``expr`` (a cron expression) and ``timezone``. Raises BackfillError."""
    workflow = _runnable(_workflow(workflow))
    if reprocess not in REPROCESS_CHOICES:
        raise BackfillError(f"reprocess must be one of {', '.join(REPROCESS_CHOICES)}, got {reprocess!r}",
                            "reprocess")
    start, end = _range(start, end)
    chosen, expr, tz = _fire_rule(workflow, schedule, expr, timezone)
    fires = _fire_times(expr, tz, start, end)
    result = BackfillPlan(workflow=workflow, schedule=chosen, cron=expr, timezone=tz, start=start, end=end,
                          reprocess=reprocess, fire_times=fires)
    existing = _existing_runs(workflow, chosen, fires)
    result.existing = sorted(existing)
    result.to_create = [at for at in fires if at not in existing]
    if reprocess != "none":
        states = UNSUCCESSFUL_RUN_STATES if reprocess == "failed" else FINISHED_RUN_STATES
        result.to_reprocess = [pk for at, (pk, state) in sorted(existing.items()) if state in states]
    return result


def _runnable(workflow: Workflow) -> Workflow:
    if workflow.current_version_id is None:
        raise BackfillError(f"workflow {workflow.name!r} cannot run: {workflow.sync_error or 'it has no valid version'}",
                            "workflow")
    if not workflow.present:
        raise BackfillError(f"workflow {workflow.name!r} is no longer defined by any module", "workflow")
    return workflow


def _range(start, end) -> tuple[datetime, datetime]:
    start, end = _aware(start, "start"), _aware(end, "end")
    for name, value in (("start", start), ("end", end)):
        if message := logical_date_error(value):
            raise BackfillError(f"{name} {message}", name)
    if end < start:
        raise BackfillError(f"end {end.isoformat()} is before start {start.isoformat()}", "end")
    return start, end


def _fire_rule(workflow: Workflow, schedule, expr: str | None, timezone: str) -> tuple[Schedule | None, str, str]:
    """The schedule (None for a given cron expression), the cron expression and its time zone."""
    if expr is not None:
        chosen, tz = None, timezone
    else:
        chosen = _schedule(workflow, schedule)
        if chosen is None:
            raise BackfillError(f"workflow {workflow.name!r} has no schedule: give a cron expression (--cron) "
                                "to say which fire times to backfill", "schedule")
        expr, tz = chosen.cron, chosen.timezone
    try:
        cron.validate(expr, tz)
    except cron.CronError as exc:
        raise BackfillError(str(exc), "timezone" if "timezone" in str(exc) else "cron") from None
    return chosen, expr, tz


def _fire_times(expr: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    cap = app_settings.MAX_BACKFILL_RUNS
    # fire_times is exclusive of `after`; a microsecond earlier makes the start itself count.
    fires = list(cron.fire_times(expr, tz, start - timedelta(microseconds=1), until=end, limit=cap + 1))
    if len(fires) > cap:
        raise BackfillError(
            f"the range {start.isoformat()} to {end.isoformat()} has more than {cap} fire times of "
            f"'{expr}' ({tz}); the limit is MAX_BACKFILL_RUNS={cap}: backfill a shorter range", "end")
    return fires


def _existing_runs(workflow: Workflow, chosen: Schedule | None, fires: list[datetime]) -> dict:
    """The runs the fire times already have: {logical date: (run id, state)}."""
    existing = {}
    for chunk_start in range(0, len(fires), 2000):
        chunk = fires[chunk_start:chunk_start + 2000]
        runs = Run.objects.filter(workflow=workflow, logical_date__in=chunk)
        runs = runs.filter(schedule=chosen) if chosen else runs.filter(schedule__isnull=True)
        existing.update({at: (pk, state) for at, pk, state in runs.values_list("logical_date", "id", "state")})
    return existing


def start(workflow, start, end, *, reprocess: str = "none", params: dict | None = None, created_by=None,
          schedule=None, expr: str | None = None, timezone: str = "UTC",
          on_progress: Callable[[int, int], None] | None = None, now: datetime | None = None) -> Backfill:
    """Create the backfill's runs (all or nothing, in one transaction) and return the Backfill.

    ``params`` override the schedule's params for every run. ``on_progress(done, total)`` is called
    after each chunk (the CLI's progress bar)."""
    the_plan = plan(workflow, start, end, schedule=schedule, reprocess=reprocess, expr=expr, timezone=timezone)
    workflow, chosen = the_plan.workflow, the_plan.schedule
    if the_plan.total == 0:
        what = f"'{the_plan.cron}' ({the_plan.timezone})"
        span = f"between {the_plan.start.isoformat()} and {the_plan.end.isoformat()}"
        if the_plan.count:
            message = (f"nothing to backfill: all {the_plan.count} fire times of {what} {span} already have a run"
                       + ("" if reprocess == "all" else " (reprocess them with reprocess=failed or all)"))
        else:
            message = f"nothing to backfill: no fire time of {what} is {span}"
        raise BackfillError(message, "start")
    version = workflow.current_version
    try:
        cleaned = clean_params(version.spec.get("params", {}), {**(chosen.params if chosen else {}), **(params or {})})
    except ParamError as exc:
        raise BackfillError(f"invalid params: {exc}", "params") from None
    now = now or clock.now()

    total, done = the_plan.total, 0
    with transaction.atomic():
        backfill = Backfill.objects.create(
            workflow=workflow, schedule=chosen, start=the_plan.start, end=the_plan.end, reprocess=reprocess,
            params=cleaned, total=total, created_by=created_by,
        )
        tasks = version.spec["tasks"]
        for offset in range(0, len(the_plan.to_create), CHUNK):
            chunk = the_plan.to_create[offset:offset + CHUNK]
            insert_runs([NewRun(Run(
                workflow=workflow, version=version, schedule=chosen, backfill=backfill, logical_date=at,
                trigger=Trigger.BACKFILL, params=cleaned, tenant=workflow.tenant, lane=Lane.BACKFILL,
                created_by=created_by,
            ), tasks, now) for at in chunk], now)
            done += len(chunk)
            if on_progress:
                on_progress(done, total)
        for offset in range(0, len(the_plan.to_reprocess), CHUNK):
            chunk = the_plan.to_reprocess[offset:offset + CHUNK]
            _reset(chunk, backfill, now)
            done += len(chunk)
            if on_progress:
                on_progress(done, total)
    return backfill


# A re-run starts from scratch: roots due now (of the runs that start; a run that waits for
# admission holds them all back), the rest waiting, each task run with a fresh set of attempts on
# top of those it used (attempt numbers stay unique, the history stays). Every task run of a
# finished run has finished; the guard says so.
_RESET_TASK_RUNS = f"""
UPDATE orchestrator_taskrun SET
    state = CASE WHEN cardinality(upstream) = 0 AND run_id = ANY (%(starting)s) THEN '{TaskState.SCHEDULED}'
                 ELSE '{TaskState.WAITING}' END,
    due_at = CASE WHEN cardinality(upstream) = 0 AND run_id = ANY (%(starting)s) THEN %(now)s::timestamptz END,
    max_attempts = attempts + {retries.allowance_sql()},
    result = NULL, error = '', worker_id = NULL, queued_at = NULL, started_at = NULL, finished_at = NULL,
    lane = %(lane)s
WHERE run_id = ANY(%(runs)s) AND state IN ({sql_list(FINISHED_TASK_STATES)})
"""


def _reset(run_ids: list[int], backfill: Backfill, now: datetime) -> None:
    # Admission's lock first, as every creator takes it, then the runs, locked in id order as every
    # writer of several runs locks them (see resolver.lock_runs): no two transactions wait on each
    # other in a cycle.
    door = admission.Door([backfill.workflow])
    runs = list(Run.objects.select_for_update(of=("self",)).filter(pk__in=run_ids, state__in=FINISHED_RUN_STATES)
                .select_related("version").order_by("pk"))
    if not runs:
        return
    reason = f"reprocessed by backfill #{backfill.pk}"
    decisions = {run.pk: door.admit(backfill.workflow, Lane.BACKFILL) for run in runs}
    starting = [pk for pk, decision in decisions.items() if decision.state == RunState.RUNNING]
    Run.objects.filter(pk__in=starting, state__in=FINISHED_RUN_STATES).update(
        state=RunState.RUNNING, reason=reason, backfill=backfill,
        lane=Lane.BACKFILL, started_at=None, finished_at=None, schedule_delay=None,
    )
    waiting = defaultdict(list)  # by admission's reason: a statement per reason, not per run
    for pk, decision in decisions.items():
        if decision.state == RunState.PENDING:
            waiting[decision.reason].append(pk)
    for why, pks in waiting.items():
        Run.objects.filter(pk__in=pks, state__in=FINISHED_RUN_STATES).update(
            state=RunState.PENDING, reason=f"{reason}, {why}", backfill=backfill,
            lane=Lane.BACKFILL, started_at=None, finished_at=None, schedule_delay=None,
        )
    with connection.cursor() as cursor:
        cursor.execute(_RESET_TASK_RUNS, {"runs": list(decisions), "starting": starting, "now": now,
                                          "lane": Lane.BACKFILL})
    # Skipped and missed runs never had task runs: they get them now, from the version they were made for.
    with_tasks = set(TaskRun.objects.filter(run_id__in=list(decisions)).values_list("run_id", flat=True).distinct())
    rows = []
    for run in runs:
        if run.pk not in with_tasks and run.version is not None:
            run.lane = Lane.BACKFILL
            rows.extend(task_runs_for(run, run.version.spec["tasks"], now, hold=run.pk not in starting))
    TaskRun.objects.bulk_create(rows, batch_size=2000)
    if starting:
        wake_due()


def progress(backfill: Backfill | int) -> tuple[int, int]:
    """(finished runs, total runs) of a backfill (an instance or a primary key)."""
    backfill = control.backfill_of(backfill)
    done = backfill.runs.filter(state__in=FINISHED_RUN_STATES).count()
    return done, backfill.total
