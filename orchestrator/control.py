"""Operator actions: pause and resume a workflow or a schedule; cancel or retry a run; retry,
discard, clear or mark task runs. The web UI, the API, the admin and Python code all call these.

Each action is a guarded update (it changes only rows still in the state it expects), and the
bulk ones take many ids at once, so the UI's and the API's bulk actions are one transaction each.

Every function takes its object the same way: the model instance, its primary key (an ``int``),
or its name where it has one (a workflow's name; a schedule's name, with ``workflow=`` when
several workflows have a schedule of that name). An unknown one raises :class:`NotFound`, whose
message names what was asked for. ``orchestrator.backfill`` takes its workflow the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

from django.db import OperationalError, connection, transaction
from psycopg.errors import DeadlockDetected

from orchestrator import callbacks, clock, cron, deadlines, mapping, notifier, resolver, results, retries
from orchestrator.channels import announce_cancelled, wake_due, wake_schedulers
from orchestrator.models import Backfill, Run, Schedule, TaskRun, Workflow
from orchestrator.states import (
    ACTIVE_RUN_STATES,
    ACTIVE_TASK_STATES,
    FINISHED_RUN_STATES,
    FINISHED_TASK_STATES,
    MARKABLE_TASK_STATES,
    RETRYABLE_TASK_STATES,
    AttemptOutcome,
    RunState,
    TaskState,
    sql_list,
)

log = logging.getLogger(__name__)

# --- SQL ---------------------------------------------------------------------------------------

# Cancel every unfinished task run of a run; the old state tells which ones a worker is running.
CANCEL_TASK_RUNS = f"""
UPDATE orchestrator_taskrun t SET state = '{TaskState.CANCELLED}', finished_at = %(now)s, error = %(reason)s
FROM (SELECT id, state FROM orchestrator_taskrun
      WHERE run_id = %(run)s AND state IN ({sql_list(ACTIVE_TASK_STATES)})
      FOR UPDATE) old
WHERE t.id = old.id
RETURNING t.id, old.state
"""

# The running attempts of cancelled task runs end now (and a waiting sensor's try); the worker's
# later write is then a no-op.
CANCEL_ATTEMPTS = f"""
UPDATE orchestrator_attempt SET outcome = '{AttemptOutcome.CANCELLED}', finished_at = %(now)s, error = %(reason)s
WHERE task_run_id = ANY (%(ids)s) AND outcome IN ('{AttemptOutcome.RUNNING}', '{AttemptOutcome.RESCHEDULED}')
"""

# Dead (or discarded) task runs get a fresh set of attempts: as many as the task allows,
# counted from now.
# A mapped task's own row is never run: retrying it is retrying its instances (see retry_run).
RETRY_TASK_RUNS = f"""
UPDATE orchestrator_taskrun SET state = '{TaskState.SCHEDULED}', due_at = %(now)s, finished_at = NULL, error = '',
    max_attempts = attempts + {retries.allowance_sql()}
WHERE id = ANY (%(ids)s) AND state IN ({sql_list(RETRYABLE_TASK_STATES)})
  AND NOT (map_index = -1 AND spec ? 'map_over')
RETURNING id, run_id, task
"""

# Downstream tasks that gave up because of a retried task wait for it again.
REWAIT_DOWNSTREAM = f"""
UPDATE orchestrator_taskrun SET state = '{TaskState.WAITING}', finished_at = NULL, due_at = NULL
WHERE id = ANY (%(ids)s) AND state IN ('{TaskState.UPSTREAM_FAILED}', '{TaskState.SKIPPED}')
"""

# The finished runs of the retried task runs are running again.
RESUME_RUNS = f"""
UPDATE orchestrator_run SET state = '{RunState.RUNNING}', finished_at = NULL
WHERE id = ANY (%(runs)s) AND state IN ('{RunState.FAILED}', '{RunState.SUCCEEDED}')
"""

# Out of the dead-letter queue: the task run stays failed (a retry can still pick it up).
DISCARD_TASK_RUNS = f"""
UPDATE orchestrator_taskrun SET state = '{TaskState.FAILED}'
WHERE id = ANY (%(ids)s) AND state = '{TaskState.DEAD}'
RETURNING run_id
"""

# The task runs of a finished run that a retry of the run gives a fresh set of attempts.
RETRYABLE_OF_RUN = f"""
SELECT id FROM orchestrator_taskrun WHERE run_id = %s AND state IN ({sql_list(RETRYABLE_TASK_STATES)})
"""


# --- Finding the object an action is about --------------------------------------------------


class NotFound(LookupError):
    """No such workflow, schedule, run or backfill; ``field`` says which argument was at fault."""

    def __init__(self, message: str, field: str):
        self.field = field
        super().__init__(message)


def _is_pk(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _get(model, ref, field: str, *, by_name: bool = True):
    if isinstance(ref, model):
        return ref
    found = None
    if _is_pk(ref):
        found = model.objects.filter(pk=ref).first()
    elif by_name and isinstance(ref, str):
        found = model.objects.filter(name=ref).first()
    else:
        kinds = "an instance, a primary key or a name" if by_name else "an instance or a primary key"
        raise TypeError(f"{field}: expected {kinds} of {model.__name__}, got {type(ref).__name__} {ref!r}")
    if found is None:
        raise NotFound(f"no {model._meta.verbose_name} {ref!r}", field)
    return found


def workflow_of(workflow: Workflow | int | str) -> Workflow:
    """The workflow given as an instance, a primary key or a name."""
    if isinstance(workflow, str):
        found = Workflow.objects.filter(name=workflow).select_related("current_version").first()
        if found is None:
            known = ", ".join(Workflow.objects.active().values_list("name", flat=True)[:20]) or "none"
            raise NotFound(f"unknown workflow {workflow!r} (known: {known})", "workflow")
        return found
    return _get(Workflow, workflow, "workflow")


def schedule_of(schedule: Schedule | int | str, workflow: Workflow | int | str | None = None) -> Schedule:
    """The schedule given as an instance, a primary key, or a name (of ``workflow``'s schedules,
    or of all schedules when that name is unique)."""
    if not isinstance(schedule, str):
        return _get(Schedule, schedule, "schedule", by_name=False)
    if workflow is not None:
        owner = workflow_of(workflow)
        found = owner.schedules.filter(name=schedule).first()
        if found is None:
            names = ", ".join(owner.schedules.order_by("name").values_list("name", flat=True)) or "none"
            raise NotFound(f"workflow {owner.name!r} has no schedule {schedule!r} (its schedules: {names})",
                           "schedule")
        return found
    found = list(Schedule.objects.filter(name=schedule).select_related("workflow")[:2])
    if not found:
        raise NotFound(f"no schedule {schedule!r}", "schedule")
    if len(found) > 1:
        raise NotFound(f"several workflows have a schedule {schedule!r}: name the workflow too (workflow=...)",
                       "schedule")
    return found[0]


def run_of(run: Run | int) -> Run:
    """The run given as an instance or a primary key (runs have no name)."""
    return _get(Run, run, "run", by_name=False)


def backfill_of(backfill: Backfill | int) -> Backfill:
    """The backfill given as an instance or a primary key."""
    return _get(Backfill, backfill, "backfill", by_name=False)


def _run_id(run: Run | int) -> int:
    if isinstance(run, Run):
        return run.pk
    if _is_pk(run):
        return run
    raise TypeError(f"run: expected an instance or a primary key of Run, got {type(run).__name__} {run!r}")


def _task_run_ids(items: Iterable[TaskRun | int]) -> list[int]:
    return sorted({item.pk if isinstance(item, TaskRun) else int(item) for item in items})


# --- Pause and resume --------------------------------------------------------------------------


def pause_workflow(workflow: Workflow | int | str) -> Workflow:
    """No schedule of the workflow fires until it is resumed; runs already started go on."""
    workflow = workflow_of(workflow)
    Workflow.objects.filter(pk=workflow.pk).update(paused=True)
    workflow.paused = True
    return workflow


def resume_workflow(workflow: Workflow | int | str, now=None) -> Workflow:
    """Resume a workflow; its schedules' missed fire times follow their missed-run policy."""
    workflow = workflow_of(workflow)
    with transaction.atomic():
        Workflow.objects.filter(pk=workflow.pk).update(paused=False)
        wake_schedulers()
    workflow.paused = False
    return workflow


def pause_schedule(schedule: Schedule | int | str, workflow: Workflow | int | str | None = None) -> Schedule:
    """The schedule does not fire until it is resumed."""
    schedule = schedule_of(schedule, workflow)
    Schedule.objects.filter(pk=schedule.pk).update(paused=True)
    schedule.paused = True
    return schedule


def resume_schedule(schedule: Schedule | int | str, workflow: Workflow | int | str | None = None,
                    now=None) -> Schedule:
    """Resume; the fire times passed while paused stay due, so the next tick applies the
    schedule's missed-run policy to them (all, latest or none)."""
    schedule = schedule_of(schedule, workflow)
    now = now or clock.now()
    with transaction.atomic():
        fields = {"paused": False}
        if schedule.next_fire_at is None:
            fields["next_fire_at"] = cron.next_fire_time(schedule.cron, schedule.timezone, now)
        Schedule.objects.filter(pk=schedule.pk).update(**fields)
        wake_schedulers()
    for key, value in fields.items():
        setattr(schedule, key, value)
    return schedule


# --- Runs and task runs ------------------------------------------------------------------------


def cancel_run(run: Run | int, reason: str = "", by=None, *, timed_out: bool = False) -> bool:
    """Cancel a pending or running run: its unfinished task runs are cancelled and workers kill
    the processes of those that are running. False when the run had already ended. A run past
    its run_timeout (``timed_out``) is stopped the same way but ends ``failed``."""
    # A worker claiming the run's first task locks that task run, then the run; this locks the
    # run, then its task runs. PostgreSQL breaks such a rare cycle by aborting one side: retry.
    for attempt in range(3):
        try:
            return _cancel_run(run, reason, by, timed_out)
        except OperationalError as exc:
            if not isinstance(exc.__cause__, DeadlockDetected) or attempt == 2:
                raise
    return False


def _cancel_run(run: Run | int, reason: str, by, timed_out: bool) -> bool:
    run_id = _run_id(run)
    now = clock.now()
    who = getattr(by, "username", None) or (str(by) if by else "")
    reason = reason or (f"cancelled by {who}" if who else "cancelled")
    with transaction.atomic():
        if timed_out:
            ended = Run.objects.filter(pk=run_id, state=RunState.RUNNING).update(
                state=RunState.FAILED, reason=reason, finished_at=now)
        else:
            ended = Run.objects.filter(pk=run_id, state__in=ACTIVE_RUN_STATES).update(
                state=RunState.CANCELLED, reason=reason, finished_at=now)
        if not ended:
            return False
        with connection.cursor() as cursor:
            cursor.execute(CANCEL_TASK_RUNS, {"run": run_id, "now": now, "reason": reason})
            rows = cursor.fetchall()
            running = [task_run_id for task_run_id, old in rows if old == TaskState.RUNNING]
            # A waiting sensor's try is open between its checks: it ends too (no process to kill).
            open_tries = running + [task_run_id for task_run_id, old in rows if old == TaskState.SENSING]
            if open_tries:
                cursor.execute(CANCEL_ATTEMPTS, {"ids": open_tries, "now": now, "reason": reason})
            if running:
                announce_cancelled(running)
    if isinstance(run, Run):
        run.state, run.reason, run.finished_at = RunState.FAILED if timed_out else RunState.CANCELLED, reason, now
    return True


def cancel_timed_out(now: datetime, limit: int = 100) -> int:
    """End the runs still active past their run timeout (``deadlines.TIMED_OUT``) as ``failed``,
    with the reason, their running tasks killed like a cancel's; returns how many. The workflow's
    webhooks and notifications hear of a failed run, its on_failure callbacks of ``timed_out``.
    The scheduler's leader calls it on every tick."""
    with connection.cursor() as cursor:
        cursor.execute(deadlines.TIMED_OUT, {"now": now, "limit": limit})
        rows = cursor.fetchall()
    ended = 0
    for run_id, seconds, _ in rows:
        reason = f"timed out: still active {float(seconds):g}s after it started (run_timeout)"
        # cancel_run is itself a guarded update: a run that ended meanwhile is left alone.
        with transaction.atomic():
            if not cancel_run(run_id, reason=reason, timed_out=True):
                continue
            notifier.runs_finished([(run_id, RunState.FAILED)], now=now)
            callbacks.run_ended([(run_id, "timed_out")], now=now)
        ended += 1
        log.warning("run %s failed: %s", run_id, reason, extra={"action": "run_timed_out", "run_id": run_id})
    return ended


def retry_task_runs(ids: Iterable[TaskRun | int], *, now=None) -> int:
    """Give dead or failed task runs (instances or primary keys) a fresh set of attempts; their
    runs resume and the downstream tasks that gave up on them wait again. Returns how many were
    retried."""
    ids = _task_run_ids(ids)
    if not ids:
        return 0
    now = now or clock.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(resolver.RUNS_OF, [ids])
        resolver.lock_runs(cursor, [row[0] for row in cursor.fetchall()])
        cursor.execute(RETRY_TASK_RUNS, {"ids": ids, "now": now})
        retried = cursor.fetchall()
        if not retried:
            return 0
        runs = sorted({run_id for _, run_id, _ in retried})
        mapping.reopen(cursor, [task_run_id for task_run_id, _, _ in retried])
        downstream = _descendants(cursor, runs, {(run_id, task) for _, run_id, task in retried})
        if downstream:
            cursor.execute(REWAIT_DOWNSTREAM, {"ids": downstream})
        cursor.execute(RESUME_RUNS, {"runs": runs})
        resolver.resolve_runs(runs, now=now)
        wake_due()
    return len(retried)


def discard_task_runs(ids: Iterable[TaskRun | int]) -> int:
    """Take dead task runs (instances or primary keys) out of the dead-letter queue (they stay
    failed); returns the count."""
    ids = _task_run_ids(ids)
    if not ids:
        return 0
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(resolver.RUNS_OF, [ids])
        resolver.lock_runs(cursor, [row[0] for row in cursor.fetchall()])
        cursor.execute(DISCARD_TASK_RUNS, {"ids": ids})
        runs = [row[0] for row in cursor.fetchall()]
        if runs:
            resolver.resolve_runs(runs)
    return len(runs)


def retry_run(run: Run | int, *, now=None) -> int:
    """Retry every dead, failed or upstream-failed task of a finished run; returns how many task
    runs were retried (upstream-failed ones wait for their retried parents)."""
    run_id = _run_id(run)
    with connection.cursor() as cursor:
        cursor.execute(RETRYABLE_OF_RUN, [run_id])
        ids = [row[0] for row in cursor.fetchall()]
    return retry_task_runs(ids, now=now)


def _descendants(cursor, runs: list[int], roots: set[tuple[int, str]]) -> list[int]:
    """Ids of the task runs downstream of ``roots`` ((run_id, task) pairs), transitively."""
    # The graph of the runs as their task runs record it (upstream names), walked in Python:
    # the runs are locked, so it cannot change meanwhile.
    cursor.execute("SELECT id, run_id, task, upstream FROM orchestrator_taskrun WHERE run_id = ANY (%s) AND map_index = -1",
                   [runs])
    children: dict[tuple[int, str], list[tuple[int, str]]] = {}
    ids: dict[tuple[int, str], int] = {}
    for task_run_id, run_id, task, upstream in cursor.fetchall():
        ids[(run_id, task)] = task_run_id
        for parent in upstream:
            children.setdefault((run_id, parent), []).append((run_id, task))
    seen: set[tuple[int, str]] = set()
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return sorted(ids[key] for key in seen)


# --- Task-level actions: clear and mark --------------------------------------------------------
# As Airflow's: clearing a task (and, by default, everything downstream of it) makes it run again
# in the same run, its old attempts kept in the history; marking sets a task's outcome by hand and
# its downstream tasks decide again by their trigger rules.

# Finished task runs start over: a task with parents (or a mapped task's own row) waits for them
# again, a root task or a mapped instance is due now. Each gets a fresh allowance of attempts;
# attempt numbers go on, so the earlier attempts stay in the history. A held-back run's tasks are
# left alone (they wait for the run to start). RETURNING the name of a result kept in the log
# storage (``results``), read from the row as it was: deleted once the clear commits.
CLEAR_TASK_RUNS = f"""
UPDATE orchestrator_taskrun t SET
    state = CASE WHEN t.map_index >= 0 OR cardinality(t.upstream) = 0 THEN '{TaskState.SCHEDULED}'
                 ELSE '{TaskState.WAITING}' END,
    due_at = CASE WHEN t.map_index >= 0 OR cardinality(t.upstream) = 0 THEN %(now)s END,
    max_attempts = t.attempts + {retries.allowance_sql("t")},
    result = NULL, error = '', worker_id = NULL, queued_at = NULL, started_at = NULL, finished_at = NULL
FROM orchestrator_run r, (SELECT id, result->'{results.KEY}'->>'name' AS stored FROM orchestrator_taskrun
                          WHERE id = ANY (%(ids)s)) old
WHERE t.id = ANY (%(ids)s) AND t.id = old.id AND r.id = t.run_id AND r.state <> '{RunState.PENDING}'
  AND t.state IN ({sql_list(FINISHED_TASK_STATES)})
RETURNING t.id, t.run_id, t.task, t.map_index, old.stored
"""


# A mapped task's own row is never marked (its instances decide it). A task run keeps the end
# time it recorded (marking changes its outcome, not when it ended); one that had not ended (waiting,
# queued, running) ends now. RETURNING the old state: a running one's worker is told to stop.
def _mark_sql(state: str) -> str:
    return f"""
UPDATE orchestrator_taskrun t SET state = '{state}', finished_at = COALESCE(t.finished_at, %(now)s), due_at = NULL,
    error = %(error)s
FROM orchestrator_run r, (SELECT id, state FROM orchestrator_taskrun WHERE id = ANY (%(ids)s) FOR UPDATE) old
WHERE t.id = old.id AND r.id = t.run_id AND r.state <> '{RunState.PENDING}'
  AND t.state IN ({sql_list(s for s in MARKABLE_TASK_STATES if s != state)})
  AND NOT (t.map_index = -1 AND t.spec ? 'map_over')
RETURNING t.id, t.run_id, t.task, t.map_index, old.state, t.finished_at
"""


# A waiting sensor marked by hand: the attempt of its try (open between its checks) ends too.
END_SENSOR_TRIES = f"""
UPDATE orchestrator_attempt SET outcome = '{AttemptOutcome.CANCELLED}', finished_at = %(now)s, error = %(reason)s
WHERE task_run_id = ANY (%(ids)s) AND outcome = '{AttemptOutcome.RESCHEDULED}'
"""

MARK_SUCCEEDED = _mark_sql(TaskState.SUCCEEDED)
MARK_FAILED = _mark_sql(TaskState.FAILED)
MARKS = {TaskState.SUCCEEDED: MARK_SUCCEEDED, TaskState.FAILED: MARK_FAILED}

# A marked run that ends again keeps the finish time it had, unless a task run marked in it ended
# later (one that had not ended ends now); a run that had not finished ends when the resolver ends it.
KEEP_RUN_FINISH = f"""
UPDATE orchestrator_run r SET finished_at = GREATEST(p.finished_at, p.marked_end)
FROM unnest(%(runs)s::bigint[], %(finished)s::timestamptz[], %(marked_end)s::timestamptz[]) AS p(id, finished_at, marked_end)
WHERE r.id = p.id AND p.finished_at IS NOT NULL AND r.state IN ({sql_list(FINISHED_RUN_STATES)})
"""

# The finished runs of cleared task runs (cancelled ones too) are running again.
REOPEN_RUNS = f"""
UPDATE orchestrator_run SET state = '{RunState.RUNNING}', finished_at = NULL
WHERE id = ANY (%(runs)s) AND state IN ('{RunState.FAILED}', '{RunState.SUCCEEDED}', '{RunState.CANCELLED}')
"""


def clear_task_runs(ids: Iterable[int], *, downstream: bool = True, now=None) -> list[int]:
    """Run finished task runs again in their run, and (``downstream``) every finished task run
    downstream of them; returns the ids of the task runs cleared. Active ones are left alone."""
    ids = sorted({int(i) for i in ids})
    if not ids:
        return []
    now = now or clock.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(resolver.RUNS_OF, [ids])
        resolver.lock_runs(cursor, [row[0] for row in cursor.fetchall()])
        cursor.execute(CLEAR_TASK_RUNS, {"ids": ids, "now": now})
        cleared = cursor.fetchall()
        if not cleared:
            return []
        runs = sorted({row[1] for row in cleared})
        if downstream:
            below = _descendants(cursor, runs, {(row[1], row[2]) for row in cleared})
            below = sorted(set(below) - {row[0] for row in cleared})
            if below:
                cursor.execute(CLEAR_TASK_RUNS, {"ids": below, "now": now})
                cleared += cursor.fetchall()
        mapping.reopen(cursor, [row[0] for row in cleared if row[3] >= 0])
        cursor.execute(REOPEN_RUNS, {"runs": runs})
        resolver.resolve_runs(runs, now=now)
        resolver.wake_due()
        stored = [row[4] for row in cleared if row[4]]
        if stored:
            transaction.on_commit(lambda: results.delete(stored))
    return sorted(row[0] for row in cleared)


def mark_task_runs(ids: Iterable[int], state: str, *, by=None, now=None) -> list[int]:
    """Set the outcome of task runs by hand (succeeded or failed); downstream tasks that had
    given up on them wait again and follow their trigger rules. A running task run's attempt ends
    (cancelled, with the reason) and its worker kills the process. Recorded end times stay: the
    task run's and its run's. Returns the ids marked."""
    if state not in MARKS:
        raise ValueError(f"a task run can be marked succeeded or failed, not {str(state)!r}")
    ids = sorted({int(i) for i in ids})
    if not ids:
        return []
    now = now or clock.now()
    reason = _marked_by(state, by)
    error = "" if state == TaskState.SUCCEEDED else reason
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(resolver.RUNS_OF, [ids])
        resolver.lock_runs(cursor, [row[0] for row in cursor.fetchall()])
        cursor.execute(MARKS[state], {"ids": ids, "now": now, "error": error})
        marked = cursor.fetchall()
        if not marked:
            return []
        runs = sorted({row[1] for row in marked})
        finished = dict(Run.objects.filter(pk__in=runs).values_list("id", "finished_at"))
        running = _end_running_attempts(cursor, marked, reason, now)
        mapping.reopen(cursor, [row[0] for row in marked if row[3] >= 0])
        _rewait_downstream(cursor, runs, marked)
        # A failed or succeeded run decides again (the resolver ends it at once when nothing is
        # left to run); a cancelled one stays cancelled.
        cursor.execute(RESUME_RUNS, {"runs": runs})
        resolver.resolve_runs(runs, now=now)
        _keep_run_finish(cursor, marked, finished)
        resolver.wake_due()
        if running:
            announce_cancelled(running)
    return sorted(row[0] for row in marked)


def _marked_by(state: str, by) -> str:
    """"marked failed by olga": a marked task run's error, and the reason its attempt ended."""
    who = getattr(by, "username", None) or (str(by) if by else "")
    return f"marked {state} by {who}" if who else f"marked {state}"


def _end_running_attempts(cursor, marked: list[tuple], reason: str, now) -> list[int]:
    """End the attempts of the marked task runs that were running or sensing (cancelled, with
    ``reason``); returns the running ones' task run ids, whose workers are told to stop them once the marks commit."""
    running = [row[0] for row in marked if row[4] == TaskState.RUNNING]
    if running:
        cursor.execute(CANCEL_ATTEMPTS, {"ids": running, "now": now, "reason": reason})
    # A waiting sensor's try is open between its checks: it ends with the mark.
    cursor.execute(END_SENSOR_TRIES, {"ids": [row[0] for row in marked], "now": now, "reason": reason})
    return running


def _rewait_downstream(cursor, runs: list[int], marked: list[tuple]) -> None:
    """The downstream tasks that had given up on the marked task runs wait again."""
    below = _descendants(cursor, runs, {(row[1], row[2]) for row in marked})
    if below:
        cursor.execute(REWAIT_DOWNSTREAM, {"ids": below})


def _keep_run_finish(cursor, marked: list[tuple], finished: dict[int, datetime | None]) -> None:
    """The runs of ``marked`` that ended again keep the finish time they had (``finished``), or
    the latest end of a task run marked in them when that is later."""
    ended: dict[int, datetime] = {}
    for row in marked:
        ended[row[1]] = max(ended.get(row[1], row[5]), row[5])
    runs = sorted(ended)
    cursor.execute(KEEP_RUN_FINISH, {"runs": runs, "finished": [finished.get(r) for r in runs],
                                     "marked_end": [ended[r] for r in runs]})
