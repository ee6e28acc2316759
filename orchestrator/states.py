"""The states of runs, task runs, attempts and workers, the transitions allowed between them, the
trigger rules and the catch-up and overlap policies: each defined once, here.

The models take their choices from these classes, the DSL its option values, the resolver its
trigger-rule SQL, and every SQL statement its state names (formatted once, at import, from the
constants below: ``f"... WHERE state = '{TaskState.SCHEDULED}'"``). ``tests/test_states.py``
fails when a statement of the product names a state, or changes a state in a way, that the
tables below do not allow; during the test suite a trigger in the test database also rejects
any transition outside them, whichever code path made it.

A guard on rows found by their ids is written ``(t.state = 'queued') IS TRUE``, never as a bare
comparison: the same test, but one no index can serve. The state columns have partial indexes
(``WHERE state = 'scheduled'`` and the like), and a planner whose statistics predate a burst
(taken when few rows were in that state) reads a bare guard as the cheapest way in, and scans
every row of the state on that index for each one looked up by id: measured at 5-8 ms for a
batch of 16 with 20,000 rows in the state, against well under 1 ms by id.

Task runs::

    waiting ──(parents settle the trigger rule)──> scheduled ──(due, a limit applies and allows)──> queued
    queued ──(a worker claims it)──> running ──> succeeded
    scheduled ──(due, no limit applies: a worker claims it)──> running
    running ──(error, attempts left; or handed back at shutdown)──> scheduled (due later)
    running ──(error, no attempts left)──> dead                   (the dead-letter queue)
    waiting ──(the trigger rule cannot hold)──> upstream_failed or skipped
    any unfinished ──(cancel, missed start deadline)──> cancelled
    dead / failed ──(retry)──> scheduled;  dead ──(discard)──> failed
    any finished ──(cleared by an operator)──> scheduled or waiting
    any but running or mapped ──(marked by an operator)──> succeeded or failed
    upstream_failed / skipped ──(a parent is retried)──> waiting
    any finished ──(a backfill reprocesses the run)──> scheduled or waiting
    waiting ──(a mapped task's parent succeeded)──> mapped ──(its instances ended)──> succeeded or failed
    running ──(a sensor's first check says "not yet")──> sensing (next check due after its interval)
    sensing ──(a check says yes)──> succeeded;  sensing ──(a check raises, or time is up)──> scheduled or dead
    running ──(an approval's question is asked)──> awaiting ──(answered)──> succeeded or failed
    awaiting ──(no answer in time)──> scheduled (asked again, attempts left) or dead
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import IntegerChoices, TextChoices


class TaskState(TextChoices):
    WAITING = "waiting", "waiting"
    SCHEDULED = "scheduled", "scheduled"
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"  # ended badly, but not in the dead-letter queue (e.g. discarded)
    DEAD = "dead", "dead"  # used every attempt: the dead-letter queue
    UPSTREAM_FAILED = "upstream_failed", "upstream failed"
    SKIPPED = "skipped", "skipped"
    CANCELLED = "cancelled", "cancelled"
    # A mapped task whose instances (rows with map_index >= 0) exist and have not all ended.
    MAPPED = "mapped", "mapped"
    # An approval task whose question was asked: it waits for a person's answer (or its timeout),
    # holding no worker.
    AWAITING = "awaiting", "awaiting an answer"
    # A sensor whose check said "not yet": it waits for its next check (due_at), holding no worker;
    # its checks are no attempts (TaskRun.checks counts them, the try is one attempt).
    SENSING = "sensing", "waiting for its next check"


class RunState(TextChoices):
    PENDING = "pending", "pending"  # held back (overlap buffer, max active runs): created so, or reprocessed
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"
    SKIPPED = "skipped", "skipped"  # recorded, never started (overlap forbid, catchup limit)
    MISSED = "missed", "missed"  # could not start within the schedule's start deadline


class Trigger(TextChoices):
    """What created a run (``Run.trigger``)."""

    SCHEDULE = "schedule", "schedule"
    MANUAL = "manual", "manual"
    API = "api", "api"
    BACKFILL = "backfill", "backfill"
    JOB = "job", "job"
    DATASET = "dataset", "dataset"  # started by another workflow's data (a dataset event)
    TEST = "test", "test"  # wf.test(): run in the calling process


class Lane(IntegerChoices):
    """Dispatch lanes (``Run.lane``, ``TaskRun.lane``): live work always goes before backfills."""

    LIVE = 0, "live"
    BACKFILL = 1, "backfill"


class AttemptOutcome(TextChoices):
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    TIMED_OUT = "timed_out", "timed out"
    LOST = "lost", "lost"  # the worker went silent
    CANCELLED = "cancelled", "cancelled"
    # A sensor's try whose latest check said "not yet": it goes on with the next check, in the
    # same attempt (a check is not an attempt).
    RESCHEDULED = "rescheduled", "waiting for its next check"
    ASKED = "asked", "asked"  # an approval's question was asked: its task run awaits the answer


class WorkerState(TextChoices):
    RUNNING = "running", "running"
    DRAINING = "draining", "draining"
    STOPPED = "stopped", "stopped"
    LOST = "lost", "lost"


ACTIVE_TASK_STATES = (TaskState.WAITING, TaskState.SCHEDULED, TaskState.QUEUED, TaskState.RUNNING,
                      TaskState.MAPPED, TaskState.AWAITING, TaskState.SENSING)
FINISHED_TASK_STATES = (
    TaskState.SUCCEEDED, TaskState.FAILED, TaskState.DEAD, TaskState.UPSTREAM_FAILED,
    TaskState.SKIPPED, TaskState.CANCELLED,
)
# Task runs that ended badly: what a clear with "only failed" takes.
FAILED_TASK_STATES = (TaskState.FAILED, TaskState.DEAD, TaskState.UPSTREAM_FAILED)
# A task run counts as taken by a worker (for the concurrency limits) while queued or running.
BUSY_TASK_STATES = (TaskState.QUEUED, TaskState.RUNNING)
# States a retry takes a task run out of: the dead-letter queue, and task runs discarded from it.
RETRYABLE_TASK_STATES = (TaskState.DEAD, TaskState.FAILED)
# States an operator can mark a task run succeeded or failed from: any but mapped (its instances
# decide it) and awaiting (its approval answers it). A running one's worker is told to stop; a
# sensing one's open attempt is closed.
MARKABLE_TASK_STATES = (TaskState.WAITING, TaskState.SCHEDULED, TaskState.QUEUED, TaskState.RUNNING, TaskState.SENSING,
                        *FINISHED_TASK_STATES)

ACTIVE_RUN_STATES = (RunState.PENDING, RunState.RUNNING)
FINISHED_RUN_STATES = (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED, RunState.SKIPPED, RunState.MISSED)
# A run that ended well: each of its task runs succeeded or was skipped.
SUCCESSFUL_TASK_STATES = (TaskState.SUCCEEDED, TaskState.SKIPPED)

LIVE_WORKER_STATES = (WorkerState.RUNNING, WorkerState.DRAINING)


def sql_list(states) -> str:
    """``'a', 'b'``: states as an SQL list, for ``state IN (...)`` in module-level SQL."""
    return ", ".join(f"'{state}'" for state in states)


# --- Transitions --------------------------------------------------------------------------------
# (from, to, who makes it). A from-state of None is an insert. A transition that is not listed
# is a bug: no statement of the product may make it.

T, R, A, W = TaskState, RunState, AttemptOutcome, WorkerState

TASK_RUN_TRANSITIONS = [
    (None, T.WAITING, "runs: a task with parents, or any task of a held-back run"),
    (None, T.SCHEDULED, "runs: a root task, due now or at the run's due time"),
    (T.WAITING, T.SCHEDULED, "resolver: the parents settle the trigger rule; runs: a held run starts"),
    (T.WAITING, T.UPSTREAM_FAILED, "resolver: the trigger rule can no longer hold"),
    (T.WAITING, T.SKIPPED, "resolver: the trigger rule skips it"),
    (T.SCHEDULED, T.QUEUED, "dispatcher: due, and the concurrency limits that apply allow it"),
    (T.QUEUED, T.RUNNING, "worker: claimed (admitted under a limit)"),
    (T.SCHEDULED, T.RUNNING, "worker: claimed straight from scheduled (due, and no limit applies)"),
    (T.RUNNING, T.SUCCEEDED, "resolver: the attempt succeeded"),
    (T.RUNNING, T.SCHEDULED, "resolver: the attempt failed with attempts left; worker: handed back at shutdown"),
    (T.RUNNING, T.DEAD, "resolver: the attempt failed and no attempt is left"),
    *[(state, T.CANCELLED, "control: the run is cancelled; scheduler: it missed its start deadline")
      for state in ACTIVE_TASK_STATES],
    (T.DEAD, T.SCHEDULED, "control: retried from the dead-letter queue"),
    (T.FAILED, T.SCHEDULED, "control: a discarded task run is retried"),
    (T.DEAD, T.FAILED, "control: discarded from the dead-letter queue"),
    (T.UPSTREAM_FAILED, T.WAITING, "control: a parent is retried"),
    (T.SKIPPED, T.WAITING, "control: a parent is retried"),
    *[(state, after, "backfill: the run is reprocessed from scratch; control: cleared, runs again")
      for state in FINISHED_TASK_STATES for after in (T.SCHEDULED, T.WAITING)],
    *[(state, after, f"control: marked {after} by an operator")
      for after in (T.SUCCEEDED, T.FAILED) for state in MARKABLE_TASK_STATES if state != after],
    # Mapping: the mapped task's own row (map_index -1) while its instances run.
    (T.WAITING, T.MAPPED, "resolver: the mapped-over parent succeeded; the instances are created"),
    (T.MAPPED, T.SUCCEEDED, "resolver: every instance succeeded"),
    (T.MAPPED, T.FAILED, "resolver: every instance ended, some badly"),
    (T.SUCCEEDED, T.MAPPED, "control: an instance is cleared or retried, the mapped task waits for it again"),
    (T.FAILED, T.MAPPED, "control: an instance is cleared or retried, the mapped task waits for it again"),
    # Approvals: the question is asked by a short attempt; then the task run waits, holding no worker.
    (T.RUNNING, T.AWAITING, "resolver: an approval's question was asked"),
    (T.AWAITING, T.SUCCEEDED, "approvals: answered with an option that goes on"),
    (T.AWAITING, T.FAILED, "approvals: answered with an option that rejects"),
    (T.AWAITING, T.SCHEDULED, "approvals: no answer in time, and an ask is left: asked again"),
    (T.AWAITING, T.DEAD, "approvals: no answer in time, and no ask is left"),
    # Sensors: between checks a row and a due time, holding no worker; a check is not an attempt.
    (T.RUNNING, T.SENSING, "resolver: a sensor's first check of its try said not yet"),
    (T.SENSING, T.SUCCEEDED, "resolver: a sensor's check said yes"),
    (T.SENSING, T.SCHEDULED, "resolver: a sensor's check raised or its time is up, attempts left"),
    (T.SENSING, T.DEAD, "resolver: a sensor's check raised or its time is up, no attempt left"),
]

RUN_TRANSITIONS = [
    (None, R.RUNNING, "runs: started at once"),
    (None, R.PENDING, "runs: held back by the overlap policy or max_active_runs"),
    (None, R.SKIPPED, "scheduler: recorded, never started (overlap, catchup limit, invalid params)"),
    (None, R.MISSED, "scheduler: recorded after its start deadline"),
    (R.PENDING, R.RUNNING, "runs: a held-back run is released"),
    (R.RUNNING, R.SUCCEEDED, "resolver: every task run ended well"),
    (R.RUNNING, R.FAILED, "resolver: every task run ended, some badly; control: past its run_timeout"),
    (R.PENDING, R.CANCELLED, "control: cancelled"),
    (R.RUNNING, R.CANCELLED, "control: cancelled"),
    (R.PENDING, R.MISSED, "scheduler: no task started within the start deadline"),
    (R.RUNNING, R.MISSED, "scheduler: no task started within the start deadline"),
    (R.FAILED, R.RUNNING, "control: a task run of it is retried"),
    (R.SUCCEEDED, R.RUNNING, "control: a task run of it is retried"),
    (R.SUCCEEDED, R.FAILED, "clearing: a run that had ended well is marked failed by an operator"),
    (R.FAILED, R.SUCCEEDED, "clearing: a run whose task runs all ended well is marked succeeded by an operator"),
    *[(state, R.RUNNING, "backfill: reprocessed; control: a task run of it is cleared")
      for state in FINISHED_RUN_STATES],
    *[(state, R.PENDING, "backfill: reprocessed, and held back by admission (max_active_runs)")
      for state in FINISHED_RUN_STATES],
]

ATTEMPT_TRANSITIONS = [
    (None, A.RUNNING, "worker: the claim creates the attempt"),
    *[(A.RUNNING, outcome, "resolver: the attempt ended; control: cancelled; worker: handed back (lost)")
      for outcome in (A.SUCCEEDED, A.FAILED, A.TIMED_OUT, A.LOST, A.CANCELLED)],
    (A.RUNNING, A.RESCHEDULED, "resolver: a sensor's check said not yet"),
    *[(A.RESCHEDULED, outcome, "resolver: a sensor's later check ended its try; control: cancelled")
      for outcome in (A.SUCCEEDED, A.FAILED, A.TIMED_OUT, A.CANCELLED)],
    (A.RUNNING, A.ASKED, "resolver: an approval's question was asked"),
]

WORKER_TRANSITIONS = [
    (None, W.RUNNING, "worker: registers at start"),
    (W.RUNNING, W.DRAINING, "worker: SIGTERM"),
    (W.RUNNING, W.STOPPED, "worker: stopped"),
    (W.DRAINING, W.STOPPED, "worker: drained and stopped"),
    (W.RUNNING, W.LOST, "reaper: heartbeat too old"),
    (W.DRAINING, W.LOST, "reaper: heartbeat too old"),
    (W.LOST, W.RUNNING, "worker: its heartbeat finds it declared lost, and it revives"),
    (W.LOST, W.DRAINING, "worker: declared lost while paused, then told to stop"),
    (W.LOST, W.STOPPED, "worker: declared lost while paused, then stopped"),
]

del T, R, A, W


@dataclass(frozen=True)
class Machine:
    """The states of one table's state column and the transitions between them."""

    table: str
    column: str
    states: type[TextChoices]
    transitions: tuple[tuple[str | None, str, str], ...]

    @property
    def initial(self) -> frozenset[str]:
        return frozenset(after for before, after, _ in self.transitions if before is None)

    @property
    def allowed(self) -> frozenset[tuple[str, str]]:
        return frozenset((before, after) for before, after, _ in self.transitions if before is not None)

    def allows(self, before: str | None, after: str) -> bool:
        return after in self.initial if before is None else before == after or (before, after) in self.allowed


MACHINES = {
    machine.table: machine for machine in (
        Machine("orchestrator_taskrun", "state", TaskState, tuple(TASK_RUN_TRANSITIONS)),
        Machine("orchestrator_run", "state", RunState, tuple(RUN_TRANSITIONS)),
        Machine("orchestrator_attempt", "outcome", AttemptOutcome, tuple(ATTEMPT_TRANSITIONS)),
        Machine("orchestrator_worker", "state", WorkerState, tuple(WORKER_TRANSITIONS)),
    )
}


# --- Trigger rules ------------------------------------------------------------------------------
# They follow Airflow's: a waiting task is decided as soon as its rule is settled, not only when
# every parent has ended (one failed parent settles all_success as upstream_failed).


class TriggerRule(TextChoices):
    ALL_SUCCESS = "all_success", "every parent succeeded"
    ALL_DONE = "all_done", "every parent ended, however"
    ONE_SUCCESS = "one_success", "at least one parent succeeded"
    ONE_FAILED = "one_failed", "at least one parent failed"
    ALL_FAILED = "all_failed", "every parent failed"
    NONE_FAILED = "none_failed", "no parent failed (succeeded or skipped)"


# How a parent's state counts for its children's rules.
PARENT_OK = (TaskState.SUCCEEDED,)
PARENT_BAD = (TaskState.FAILED, TaskState.DEAD, TaskState.UPSTREAM_FAILED, TaskState.CANCELLED)
PARENT_SKIPPED = (TaskState.SKIPPED,)

# Each rule decides a waiting child from its parents' counts: n parents, ``ok`` (succeeded),
# ``bad`` (failed, dead, upstream_failed, cancelled), ``skip`` (skipped). The first condition that
# holds gives the child's next state; when none holds, the child keeps waiting. The resolver turns
# this table into one SQL CASE (``release.RELEASE_CHILDREN``).
TRIGGER_RULE_DECISIONS: dict[str, tuple[tuple[str, str], ...]] = {
    TriggerRule.ALL_SUCCESS: (
        ("bad > 0", TaskState.UPSTREAM_FAILED), ("skip > 0", TaskState.SKIPPED), ("ok = n", TaskState.SCHEDULED),
    ),
    TriggerRule.ALL_DONE: (("ok + bad + skip = n", TaskState.SCHEDULED),),
    TriggerRule.ONE_SUCCESS: (
        ("ok > 0", TaskState.SCHEDULED), ("skip = n", TaskState.SKIPPED),
        ("ok + bad + skip = n", TaskState.UPSTREAM_FAILED),
    ),
    TriggerRule.ONE_FAILED: (("bad > 0", TaskState.SCHEDULED), ("ok + skip = n", TaskState.SKIPPED)),
    TriggerRule.ALL_FAILED: (("ok + skip > 0", TaskState.SKIPPED), ("bad = n", TaskState.SCHEDULED)),
    TriggerRule.NONE_FAILED: (("bad > 0", TaskState.UPSTREAM_FAILED), ("ok + skip = n", TaskState.SCHEDULED)),
}
DEFAULT_TRIGGER_RULE = TriggerRule.ALL_SUCCESS


# --- Schedule policies --------------------------------------------------------------------------


class Catchup(TextChoices):
    """Which fire times missed while the scheduler was away (or the schedule paused) still run."""

    ALL = "all", "every missed fire time"
    LATEST = "latest", "only the latest missed fire time"
    NONE = "none", "no missed fire time"


class Overlap(TextChoices):
    """What a fire time does while an earlier run of the same schedule is still active
    (``Scheduler._plan`` applies it)."""

    ALLOW = "allow", "allow"
    FORBID = "forbid", "forbid (skip the new run)"
    REPLACE = "replace", "replace (cancel the active run)"
    BUFFER_ONE = "buffer_one", "buffer one"
