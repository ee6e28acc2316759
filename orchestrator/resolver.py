"""What happens when an attempt ends: the retry rule, the trigger rules that release (or give up
on) the children (their statements in ``release.py``), and the end of the run. Set-based SQL,
called inside the caller's transaction (a worker's completion batch, the reaper, the control
functions), so an outcome, its children and its run change together or not at all.

The retry rule (``retries.py``): an attempt that did not succeed schedules the next one after a
backoff, until ``max_attempts`` attempts were made; then the task run is ``dead``: the dead-letter
queue.

Trigger rules follow Airflow's: a child is decided as soon as its rule is settled, not only when
every parent is done (one failed parent settles ``all_success`` as ``upstream_failed``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from django.db import connection

from orchestrator import (
    callbacks,
    clock,
    counts,
    datasets,
    db,
    deadlines,
    mapping,
    notifications,
    notifier,
    retries,
    tracing,
)
from orchestrator.channels import wake_due
from orchestrator.release import decide_children
from orchestrator.states import (
    ACTIVE_TASK_STATES,
    FINISHED_TASK_STATES,
    SUCCESSFUL_TASK_STATES,
    AttemptOutcome,
    RunState,
    TaskState,
    Trigger,
    sql_list,
)


@dataclass
class Ending:
    """One attempt's end, as reported by a worker or decided by the reaper."""

    task_run_id: int
    number: int
    outcome: str  # an AttemptOutcome value
    result: str | None = None  # JSON text, only for succeeded
    error: str = ""
    traceback: str = ""
    log_path: str = ""
    metadata: str | None = None  # JSON text of ctx.metadata, for the datasets a task produces
    exception_class: str = ""  # the dotted path of the exception's class, from the exception object
    job: bool = False  # a one-task job run: no children to release
    # A job whose spec (as its claim read it) declares no callbacks and no datasets: its success's
    # answer calls for no statement (worker.batch.Batch.flush commits such a batch before reading).
    plain: bool = False
    run_id: int | None = None  # saves a lookup when known
    sensor_timeout: bool = False  # a sensor's "not yet" past its timeout (notifications hear of it)
    check: int | None = None  # a waiting sensor's check (not an attempt): its task run's checks when claimed
    # A mapped instance of a map without max_parallel, as the worker that ran it knows (its claim's
    # message, ``settles_later``): recorded without its run's lock, the map settled after (see
    # SentEndings.deferred). False: the run is locked first, as for any ending.
    unlocked: bool = False
    # When its claim began the run, when the worker has not written that yet (worker.batch.RUN_STARTS):
    # a one-task job's run start is written with its end, one row version fewer.
    started: datetime | None = None


def settles_later(message: dict) -> bool:
    """Whether the end of this claimed task run may be recorded without its run's lock: a mapped
    instance (its claim's context gave it a map index) whose map has no max_parallel. Nothing is
    decided by such an ending but whether its map is over, and that is decided under the lock by
    a statement of its own (TRY_LOCK_RUNS, then mapping.SETTLE; or ``settle_maps``)."""
    return message.get("map_index") is not None and not message.get("spec", {}).get("max_parallel")


# What an accepted ending may leave its task run in that decides nothing about the run (a retry
# due later, an approval asked, a sensor's "not yet"): no child to release, no run to end.
_HOLDING = (TaskState.SCHEDULED, TaskState.AWAITING, TaskState.SENSING)

# --- SQL ---------------------------------------------------------------------------------------

# The run row is the lock that serializes everything deciding about a run's task runs. Without
# it, two workers ending the last two parents of a join at the same moment would each see the
# other parent still running (neither commit visible yet) and neither would release the join.
# Taken first, in id order, by every writer (workers, reaper, control), so writers queue rather
# than deadlock. NO KEY UPDATE: it does not block inserts that reference the run.
# It also says which runs map or branch (Run.dynamic), for the steps of mapping.py.
_LOCK_RUNS = "SELECT id, dynamic FROM orchestrator_run WHERE id = ANY ({}) ORDER BY id FOR NO KEY UPDATE"
LOCK_RUNS = _LOCK_RUNS.format("%s")
# The same without waiting: the runs no other transaction holds. Taken by a worker's batch of a
# map's instances after it wrote their endings without the lock (Ending.unlocked), and before the
# statement that settles the map: that statement's snapshot, taken after the lock, sees every
# ending committed by the transaction that held the lock before. A run another transaction holds
# is settled after this batch commits (SentEndings.deferred): whoever holds it then cannot have
# seen this batch's endings, and whoever takes it after the commit will.
TRY_LOCK_RUNS = db.prepared("SELECT id FROM orchestrator_run WHERE id = ANY (%s) ORDER BY id FOR NO KEY UPDATE SKIP LOCKED")
# The runs of some task runs, to lock them (LOCK_RUNS) before touching the task runs.
RUNS_OF = "SELECT DISTINCT run_id FROM orchestrator_taskrun WHERE id = ANY (%s)"

# A run's schedule_delay when it starts at {} (its first task's claim): counted from when it was
# due, the fire time of a scheduled run or a job's run_after (its logical date), the creation of
# any other (a manual or backfill run's logical date can be any date in the past or future).
RUN_STARTED = (f"EXTRACT(EPOCH FROM {{}} - CASE WHEN trigger IN ('{Trigger.SCHEDULE}', '{Trigger.JOB}') "
               "THEN logical_date ELSE created_at END)")

# The answer of END_TASK_RUNS and END_CHECKS, in kinds of rows that ``_answers`` puts together:
# each accepted task run (an id); each run of them that maps or branches (no id, ``dynamic``);
# and, END_TASK_RUNS' own, each run that ended with its job (no id, ``run_state``).
_ANSWER = """
SELECT t.id, t.run_id, t.state, t.produces, t.calls, NULL::bool AS dynamic, NULL::text AS run_state,
    NULL::bigint AS workflow_id, t.instance FROM t
UNION ALL
SELECT NULL, l.id, NULL, NULL, NULL, true, NULL, NULL, NULL FROM l WHERE l.dynamic"""

# End many attempts at once, in one statement (a worker's batch is one round trip and as few
# statements as it can be). First the runs are locked (``l``, LOCK_RUNS' rule): the task run update
# names ``l`` in a condition no row depends on, which PostgreSQL evaluates once before the update
# touches any row. The guard (state running, same attempt number and, for a worker's own writes,
# the same worker) makes a late write from a reaped worker or a cancelled task change nothing.
# Failures follow the retry rule above, computed from each row's spec. A sensor's "not yet"
# (outcome rescheduled) makes it "sensing", its next check due after its interval: a check is not
# an attempt (the attempt of its try stays open, "rescheduled", until a check ends the try); each
# check counts in ``checks``, and the latest answer is kept. A waiting sensor's check (``d.check``,
# claimed by worker.batch.CLAIM_CHECKS without an attempt) is accepted while the sensor still
# waits with the check count it was claimed at, so a check claimed twice (after its lease) is
# recorded once: END_CHECKS.
# The run of a one-task job (``d.job``) ends here with its task run: it releases nothing, and
# the check that no other task run of it is unfinished keeps the rule of FINISH_RUNS.
# The answer joins nothing: a row per accepted task run (with what its ending said, carried by
# its RETURNING, so the attempts' update reads no other CTE), then a row per run that maps or
# branches and a row per job run ended, which ``_answers`` puts together. A join of those
# CTEs was a nested loop (the planner expects one row of each: a DML CTE's estimate), a cost
# that grew with the square of the endings in one statement (500 job endings: 250,000 rows of
# the ended runs read again).
END_TASK_RUNS = db.prepared(f"""
WITH l AS MATERIALIZED (
    {_LOCK_RUNS.format("%(runs)s::bigint[]")}
), d AS (
    SELECT *, outcome = '{AttemptOutcome.RESCHEDULED}' AS not_yet, outcome = '{AttemptOutcome.ASKED}' AS asked
    FROM unnest(%(ids)s::bigint[], %(numbers)s::int[], %(outcomes)s::text[], %(results)s::text[],
                %(errors)s::text[], %(tracebacks)s::text[], %(log_paths)s::text[], %(exception_classes)s::text[],
                %(jobs)s::bool[], %(starts)s::timestamptz[])
        AS d(id, number, outcome, result, error, traceback, log_path, exception_class, job, started)
), t AS (
UPDATE orchestrator_taskrun t SET
    state = CASE WHEN d.outcome = '{AttemptOutcome.SUCCEEDED}' THEN '{TaskState.SUCCEEDED}'
                 WHEN d.not_yet THEN '{TaskState.SENSING}'
                 WHEN d.asked THEN '{TaskState.AWAITING}'
                 WHEN t.attempts < t.max_attempts THEN '{TaskState.SCHEDULED}' ELSE '{TaskState.DEAD}' END,
    checks = t.checks + CASE WHEN t.spec ? 'sensor' THEN 1 ELSE 0 END,
    last_answer = CASE WHEN d.not_yet THEN left(COALESCE(d.result, ''), 200) ELSE t.last_answer END,
    result = CASE WHEN d.outcome = '{AttemptOutcome.SUCCEEDED}' THEN d.result::jsonb ELSE t.result END,
    error = CASE WHEN d.outcome = '{AttemptOutcome.SUCCEEDED}' THEN '' ELSE d.error END,
    due_at = CASE WHEN d.not_yet
        THEN %(now)s + make_interval(secs => (t.spec->'sensor'->>'every')::float8)
        -- An approval waits for its answer until its timeout (none: NULL, for ever).
        WHEN d.asked THEN %(now)s + make_interval(secs => (t.spec->'approval'->>'timeout')::float8)
        WHEN d.outcome <> '{AttemptOutcome.SUCCEEDED}' AND t.attempts < t.max_attempts
        THEN %(now)s + make_interval(secs => {retries.delay_sql("t", "t.attempts")})
        ELSE t.due_at END,
    finished_at = CASE WHEN d.not_yet OR d.asked
                         OR (d.outcome <> '{AttemptOutcome.SUCCEEDED}' AND t.attempts < t.max_attempts) THEN NULL
                       ELSE %(now)s END
FROM d
WHERE (SELECT count(*) FROM l) >= 0
  AND t.id = d.id AND (t.state = '{TaskState.RUNNING}' AND t.attempts = d.number
  AND (%(worker)s::bigint IS NULL OR t.worker_id = %(worker)s::bigint)) IS TRUE
RETURNING t.id, t.run_id, t.state, t.spec ? 'produces' AS produces, t.spec ? 'callbacks' AS calls,
    t.map_index >= 0 AS instance, d.number, d.outcome, d.not_yet, d.error, d.traceback, d.exception_class,
    d.log_path, d.job, d.started
), a AS (
    -- The attempt rows of the task runs whose end was accepted above, in the same round trip. A
    -- sensor's try stays open while its checks say "not yet" (rescheduled, no end time).
    UPDATE orchestrator_attempt a SET outcome = t.outcome, error = t.error,
        finished_at = CASE WHEN t.not_yet THEN NULL ELSE %(now)s END,
        traceback = t.traceback, exception_class = t.exception_class,
        log_path = CASE WHEN t.log_path <> '' THEN t.log_path ELSE a.log_path END
    FROM t
    WHERE a.task_run_id = t.id AND a.number = t.number AND (a.outcome = '{AttemptOutcome.RUNNING}') IS TRUE
), s AS (
    -- A job's start its worker had not written (Ending.started), when this ending does not end
    -- its run (a retry, an approval asked, a sensor's "not yet"); j writes it with the run's end.
    UPDATE orchestrator_run r SET started_at = t.started, schedule_delay = {RUN_STARTED.format("t.started")}
    FROM t
    WHERE t.job AND t.started IS NOT NULL AND t.state NOT IN ({sql_list(FINISHED_TASK_STATES)})
      AND r.id = t.run_id AND r.started_at IS NULL
), e AS (
    SELECT id, run_id, state IN ({sql_list(SUCCESSFUL_TASK_STATES)}) AS ok, started FROM t
    WHERE job AND state IN ({sql_list(FINISHED_TASK_STATES)})
), j AS (
    UPDATE orchestrator_run r
    SET state = CASE WHEN e.ok THEN '{RunState.SUCCEEDED}' ELSE '{RunState.FAILED}' END, finished_at = %(now)s,
        -- Its start, when the worker that claimed it has not written it yet (Ending.started).
        started_at = COALESCE(r.started_at, e.started),
        schedule_delay = CASE WHEN r.started_at IS NULL AND e.started IS NOT NULL
                              THEN {RUN_STARTED.format("e.started")} ELSE r.schedule_delay END
    FROM e
    WHERE r.id = e.run_id AND (r.state = '{RunState.RUNNING}') IS TRUE
      AND NOT EXISTS (SELECT 1 FROM orchestrator_taskrun x WHERE x.run_id = r.id AND x.id <> e.id
                      AND x.state NOT IN ({sql_list(FINISHED_TASK_STATES)}))
    RETURNING r.id, r.state, r.workflow_id
)
{_ANSWER}
UNION ALL
SELECT NULL, j.id, NULL, NULL, NULL, NULL, j.state, j.workflow_id, NULL FROM j
""")

# End the checks of waiting sensors (claimed by worker.batch.CLAIM_CHECKS: no attempt, no change
# of state), the runs locked first as above. Accepted while the sensor still waits, with the
# check count it was claimed at (a check claimed again after its lease is recorded once) and,
# for a worker's own writes, claimed by this worker. "Not yet": the next check after the
# interval. Yes: succeeded, its try's attempt too. A check that raised (or timed out) ends the
# try as a failed attempt: the retry rule. Rows as END_TASK_RUNS' (a sensor is never a job run).
END_CHECKS = db.prepared(f"""
WITH l AS MATERIALIZED (
    {_LOCK_RUNS.format("%(runs)s::bigint[]")}
), d AS (
    SELECT *, outcome = '{AttemptOutcome.RESCHEDULED}' AS not_yet, outcome = '{AttemptOutcome.SUCCEEDED}' AS yes
    FROM unnest(%(ids)s::bigint[], %(numbers)s::int[], %(checks)s::int[], %(outcomes)s::text[], %(results)s::text[],
                %(errors)s::text[], %(tracebacks)s::text[], %(log_paths)s::text[], %(exception_classes)s::text[])
        AS d(id, number, checked, outcome, result, error, traceback, log_path, exception_class)
), t AS (
UPDATE orchestrator_taskrun t SET
    state = CASE WHEN d.yes THEN '{TaskState.SUCCEEDED}' WHEN d.not_yet THEN '{TaskState.SENSING}'
                 WHEN t.attempts < t.max_attempts THEN '{TaskState.SCHEDULED}' ELSE '{TaskState.DEAD}' END,
    checks = t.checks + 1,
    last_answer = CASE WHEN d.not_yet THEN left(COALESCE(d.result, ''), 200) ELSE t.last_answer END,
    result = CASE WHEN d.yes THEN d.result::jsonb ELSE t.result END,
    error = CASE WHEN d.yes OR d.not_yet THEN '' ELSE d.error END,
    due_at = CASE WHEN d.not_yet THEN %(now)s + make_interval(secs => (t.spec->'sensor'->>'every')::float8)
        WHEN NOT d.yes AND t.attempts < t.max_attempts THEN %(now)s + make_interval(secs => {retries.delay_sql("t", "t.attempts")})
        ELSE t.due_at END,
    finished_at = CASE WHEN d.not_yet OR (NOT d.yes AND t.attempts < t.max_attempts) THEN NULL ELSE %(now)s END
FROM d
WHERE (SELECT count(*) FROM l) >= 0
  AND t.id = d.id AND (t.state = '{TaskState.SENSING}' AND t.attempts = d.number AND t.checks = d.checked
  AND (%(worker)s::bigint IS NULL OR t.worker_id = %(worker)s::bigint)) IS TRUE
RETURNING t.id, t.run_id, t.state, t.spec ? 'produces' AS produces, t.spec ? 'callbacks' AS calls,
    t.map_index >= 0 AS instance
), a AS (
    -- The try's attempt ends with the check that ends the try; a "not yet" writes nothing to it.
    UPDATE orchestrator_attempt a SET outcome = d.outcome, finished_at = %(now)s, error = d.error,
        traceback = d.traceback, exception_class = d.exception_class,
        log_path = CASE WHEN d.log_path <> '' THEN d.log_path ELSE a.log_path END
    FROM t JOIN d ON d.id = t.id
    WHERE a.task_run_id = d.id AND a.number = d.number AND NOT d.not_yet
      AND (a.outcome = '{AttemptOutcome.RESCHEDULED}') IS TRUE
)
{_ANSWER}
""")

# The start of a sensor's current try (its attempt, which spans every check of the try): its
# timeout counts from there. One row by the attempt's unique key per check.
SENSING_SINCE = """
SELECT t.id, (t.spec->'sensor'->>'timeout')::float8, a.started_at
FROM orchestrator_taskrun t
JOIN orchestrator_attempt a ON a.task_run_id = t.id AND a.number = t.attempts
WHERE t.id = ANY (%(ids)s) AND t.spec->'sensor'->>'timeout' IS NOT NULL
"""

# A running run whose task runs have all ended: succeeded when each one ended well. Whether any
# task run of a run is unfinished is one probe of the partial index taskrun_unfinished per run,
# which stops at the first entry: a batch pays the same in a run of ten task runs or of 100,000.
# Whether each ended well is read from the run's counts (counts.py: a few dozen rows; grouped, so
# never an anti-join), so the last batch costs what the others do. The probe is a scalar subquery
# with LIMIT 1, not NOT EXISTS: that may become an anti-join reading every run's index entries.
# The runs are found by their ids, not by joining every running run: after a burst of runs the planner's
# statistics can still count a few dozen running ones, and a hash join would read them all. It
# also folds the runs' counts (counts.fold_ctes), once per batch of a run.
FINISH_RUNS = db.prepared(f"""
WITH {counts.fold_ctes("%(runs)s::bigint[]")}, f AS MATERIALIZED (
    SELECT r.id, NOT EXISTS (SELECT FROM orchestrator_taskruncount c WHERE c.run_id = r.id
                             AND c.state NOT IN ({sql_list(SUCCESSFUL_TASK_STATES)})
                             GROUP BY c.instances_of, c.state HAVING sum(c.n) <> 0)
        -- A job's task run is not counted (counts.JOB_TASK_RUNS): a job's run reads it.
        AND CASE WHEN r.trigger = '{Trigger.JOB}' THEN NOT EXISTS (
            SELECT FROM orchestrator_taskrun x WHERE x.run_id = r.id AND (x.spec->>'call') = 'job'
              AND x.state NOT IN ({sql_list(SUCCESSFUL_TASK_STATES)})) ELSE true END AS ok
    FROM orchestrator_run r
    WHERE r.id = ANY (%(runs)s) AND (r.state = '{RunState.RUNNING}') IS TRUE
      AND (SELECT x.id FROM orchestrator_taskrun x
           WHERE x.run_id = r.id AND x.state IN ({sql_list(ACTIVE_TASK_STATES)}) LIMIT 1) IS NULL
)
UPDATE orchestrator_run r SET state = CASE WHEN f.ok THEN '{RunState.SUCCEEDED}' ELSE '{RunState.FAILED}' END,
    finished_at = %(now)s
FROM f WHERE r.id = f.id AND (r.state = '{RunState.RUNNING}') IS TRUE
RETURNING r.id, r.state, r.workflow_id
""")


# --- functions ---------------------------------------------------------------------------------

@dataclass
class SentEndings:
    """A batch of endings whose statement is sent (``send_endings``) and whose answer is not read
    yet (``receive_endings``): a worker sends its claim in the same round trip."""

    endings: list[Ending]
    now: datetime
    end: object = None
    checks: object = None  # the cursor of END_CHECKS, when waiting sensors' checks are among the endings
    # Runs whose endings are all mapped instances (Ending.unlocked): END_TASK_RUNS did not lock them.
    unlocked: list[int] = field(default_factory=list)
    # Of those, the runs another transaction held when this batch came to settle their maps: the
    # caller settles them once this transaction committed (``settle_maps``, in one of its own).
    deferred: list[int] = field(default_factory=list)


def end_attempts(endings: Sequence[Ending], *, worker_id: int | None = None,
                 now: datetime | None = None) -> list[tuple[int, int, str]]:
    """Record many attempt endings in the current transaction; returns (task_run_id, run_id,
    new_state) for each ending that was accepted. Children and runs are resolved too."""
    if not endings:
        return []
    with db.pipeline():
        sent = send_endings(endings, worker_id=worker_id, now=now)
        return receive_endings(sent)


def send_endings(endings: Sequence[Ending], *, worker_id: int | None = None,
                 now: datetime | None = None) -> SentEndings:
    """Send the statements that record these endings (END_TASK_RUNS: lock their runs, end the
    attempts and task runs, and the runs of one-task jobs; END_CHECKS: the checks of waiting
    sensors). In pipeline mode (``db.pipeline``)
    nothing waits for an answer here."""
    now = now or clock.now()
    runs = {e.run_id for e in endings}
    unlocked = set()
    if None in runs:
        with connection.cursor() as cursor:
            cursor.execute(RUNS_OF, [[e.task_run_id for e in endings]])
            runs = {row[0] for row in cursor.fetchall()}
    else:
        # The runs of which only mapped instances end here are not locked (Ending.unlocked): two
        # workers' batches of one map write at the same time and take the lock only to settle it.
        unlocked = runs - {e.run_id for e in endings if not e.unlocked or e.check is not None}
    endings = _sensor_timeouts(endings, now)
    attempts = [e for e in endings if e.check is None]
    checks = [e for e in endings if e.check is not None]
    sent = SentEndings(endings=endings, now=now, end=db.cursor(), unlocked=sorted(unlocked))
    # Both statements lock every other run of the batch (in id order, first thing), so their
    # writer takes its run locks in one order, as every writer does.
    common = {"runs": sorted(runs - unlocked), "worker": worker_id, "now": now}
    db.execute(sent.end, END_TASK_RUNS, {**common, "jobs": [e.job and e.run_id is not None for e in attempts],
                                         **_columns(attempts)})
    if checks:
        sent.checks = db.cursor()
        db.execute(sent.checks, END_CHECKS, {**common, "checks": [e.check for e in checks], **_columns(checks)})
    return sent


def _columns(endings: Sequence[Ending]) -> dict:
    return {"ids": [e.task_run_id for e in endings], "numbers": [e.number for e in endings],
            "outcomes": [e.outcome for e in endings], "results": [e.result for e in endings],
            "errors": [e.error for e in endings], "tracebacks": [e.traceback for e in endings],
            "log_paths": [e.log_path for e in endings], "exception_classes": [e.exception_class for e in endings],
            "starts": [e.started for e in endings]}


def receive_endings(sent: SentEndings) -> list[tuple[int, int, str]]:
    """Read the answer of ``send_endings`` and do what it calls for: dataset events, callbacks,
    the children the ended task runs release and the end of their runs. Returns (task_run_id,
    run_id, new_state) for each ending that was accepted."""
    rows = _answers(sent)
    if not rows:
        return []
    finished = list({run_id: (run_id, run_state, workflow_id)
                     for _, run_id, _, _, _, _, run_state, workflow_id, _ in rows if run_state is not None}.values())
    if finished:
        _runs_finished(finished, sent.now)
    dynamic = {row[1] for row in rows if row[5]} | (set(sent.unlocked) & {row[1] for row in rows})
    accepted = [row[:3] for row in rows]
    won = {row[0] for row in accepted}
    mine = [e for e in sent.endings if e.task_run_id in won]
    _announce(rows, mine, sent.now)
    tracing.task_runs_ended(accepted, FINISHED_TASK_STATES)
    # The runs of which only mapped instances ended in this batch (see resolve_runs' ``quiet``).
    quiet = dynamic - {row[1] for row in rows if not row[8]}
    sent.deferred = _lock_unlocked(sent, rows, quiet)
    _resolve_after(accepted, mine, sent.now, done={row[1] for row in rows if row[6] is not None}, dynamic=dynamic,
                   quiet=quiet, deferred=set(sent.deferred))
    return accepted


def _lock_unlocked(sent: SentEndings, rows: list[tuple], quiet: set[int]) -> list[int]:
    """Lock the runs whose instances' endings were written without their lock, where one of them
    ended (a retry or a sensor's "not yet" decides nothing); returns those another transaction
    holds, to settle after the commit (``settle_maps``). A run where the endings turned out not to
    be instances only (a caller's mistake) is locked waiting, as any ending's run."""
    wanted = set(sent.unlocked) & {run_id for _, run_id, state, *_ in rows if state not in _HOLDING}
    if not wanted:
        return []
    odd = wanted - quiet
    if odd:
        with connection.cursor() as cursor:
            lock_runs(cursor, odd)
    with db.cursor() as cursor:
        db.execute(cursor, TRY_LOCK_RUNS, [sorted(wanted - odd)])
        held = {row[0] for row in cursor.fetchall()}
    return sorted(wanted - odd - held)


def settle_maps(run_ids: Iterable[int], *, now: datetime | None = None) -> int:
    """Settle the maps of these runs in the current transaction, once the endings of their
    instances written without the run's lock committed (SentEndings.deferred): the runs are locked
    (waiting for whoever holds them), then mapping.SETTLE and, where a map ended, the rest of the
    resolution. Returns how many task runs became due (the caller wakes the roles)."""
    runs = sorted(set(run_ids))
    return resolve_runs(runs, now=now, quiet=runs) if runs else 0


def _answers(sent: SentEndings) -> list[tuple]:
    """The rows END_TASK_RUNS and the sensor checks' statement answered, one per accepted task run:
    (id, run_id, state, produces, calls, dynamic, run_state, workflow_id, instance), its run's
    rows (_ANSWER) put in."""
    with sent.end:
        rows = sent.end.fetchall()
    if sent.checks is not None:
        with sent.checks:
            rows += sent.checks.fetchall()
    dynamic = {row[1] for row in rows if row[0] is None and row[5]}
    ended = {row[1]: row[6:8] for row in rows if row[0] is None and row[6] is not None}
    return [(*row[:5], row[1] in dynamic, *ended.get(row[1], (None, None)), row[8]) for row in rows if row[0] is not None]


def _announce(rows: list[tuple], mine: list[Ending], now: datetime) -> None:
    """Dataset events and callbacks, only for the task runs that declare them (flags from END_TASK_RUNS)."""
    producers = [task_run_id for task_run_id, _, state, produces, *_ in rows if produces and state == TaskState.SUCCEEDED]
    if producers:
        datasets.record_events(producers, {e.task_run_id: e.metadata for e in mine if e.metadata}, now=now)
    # A sensor's "not yet" is no retry: it calls no on_retry.
    checks = {e.task_run_id for e in mine if e.outcome == AttemptOutcome.RESCHEDULED}
    calling = [(task_run_id, state) for task_run_id, _, state, _, calls, *_ in rows if calls and task_run_id not in checks]
    if calling:
        callbacks.task_ended(calling, now=now)
    _notify(mine, now)


def _notify(mine: list[Ending], now: datetime) -> None:
    """The notifications of a sensor's timeout and of an approval asked."""
    timed_out = {e.task_run_id: e.error for e in mine if e.sensor_timeout}
    if timed_out:
        notifications.sensor_timed_out(list(timed_out), timed_out, now=now)
    asked = [e.task_run_id for e in mine if e.outcome == AttemptOutcome.ASKED]
    if asked:
        notifications.task_runs_event("approval_requested", asked, now=now)


def _resolve_after(accepted: list[tuple], mine: list[Ending], now: datetime, done=frozenset(),
                   dynamic=frozenset(), quiet=frozenset(), deferred=frozenset()) -> None:
    """Release the children of the task runs that ended (a job has none) and end complete runs
    (but ``done``: ended already, and ``deferred``: settled after the commit); wake the
    dispatchers when something became due (a retry, a released child). ``dynamic``: the runs that
    map or branch, as locked; ``quiet``: those of them where only mapped instances ended."""
    ended_runs = {run_id for _, run_id, state in accepted if state not in _HOLDING} - done - deferred
    jobs = {e.task_run_id for e in mine if e.job}
    parents = {run_id for task_run_id, run_id, state in accepted
               if state not in _HOLDING and task_run_id not in jobs} - deferred
    # A sensor's "not yet" (sensing) wakes nobody: its next check is due an interval from now, and
    # every role already waits until the next due time it knows (the worker that recorded it knows it).
    retrying = any(state == TaskState.SCHEDULED for _, _, state in accepted)
    ended = [task_run_id for task_run_id, _, state in accepted if state not in _HOLDING and task_run_id not in jobs]
    released = resolve_runs(ended_runs, now=now, release=parents, dynamic=dynamic, quiet=quiet,
                            ended=ended) if ended_runs else 0
    if retrying or released:
        wake_due()


def lock_runs(cursor, run_ids) -> set[int]:
    """Lock the run rows (see LOCK_RUNS); returns the ids of those that map or branch."""
    cursor.execute(LOCK_RUNS, [sorted(run_ids)])
    return {run_id for run_id, dynamic in cursor.fetchall() if dynamic}


def _sensor_timeouts(endings: Sequence[Ending], now: datetime) -> list[Ending]:
    """A sensor's "not yet" past its timeout ends its try as timed out (then the retry rule)."""
    checks = [e for e in endings if e.outcome == AttemptOutcome.RESCHEDULED]
    if not checks:
        return list(endings)
    with connection.cursor() as cursor:
        cursor.execute(SENSING_SINCE, {"ids": [e.task_run_id for e in checks]})
        rows = cursor.fetchall()
    over = {}
    for task_run_id, timeout, since in rows:
        if since is not None and (now - since).total_seconds() >= timeout:
            over[task_run_id] = timeout
    return [replace(e, outcome=AttemptOutcome.TIMED_OUT, sensor_timeout=True,
                    error=f"sensor timed out: no true answer in {over[e.task_run_id]:g}s")
            if e.outcome == AttemptOutcome.RESCHEDULED and e.task_run_id in over else e
            for e in endings]


def resolve_runs(run_ids: Iterable[int], *, now: datetime | None = None, release: Iterable[int] | None = None,
                 dynamic: Iterable[int] | None = None, quiet: Iterable[int] = (),
                 ended: Iterable[int] | None = None) -> int:
    """Decide the waiting children of these runs (of ``release`` only, when given: runs known to
    have no waiting tasks can skip that query), then end the runs that are complete. Returns how
    many children were released (made due). ``dynamic``: which of them map or branch, when the
    caller locked the runs already (otherwise they are locked here).

    ``quiet``: runs of which only mapped instances ended. An instance has no children and its
    mapped task's row stays active until every instance ended, so in such a run nothing but the
    map can move: its step (mapping.settle) runs alone, and the rest of the resolution (the
    children, the run's end) only where it ended a mapped task. A batch of instances in the
    middle of a map costs one statement (mapping.SETTLE).

    ``ended``: the task runs that just ended, when known (a worker's batch): in runs that neither
    map nor branch, only their children are looked at (release.RELEASE_CHILDREN_OF)."""
    runs = sorted(set(run_ids))
    if not runs:
        return 0
    release = runs if release is None else sorted(set(release))
    now = now or clock.now()
    released = 0
    with connection.cursor() as cursor:
        if dynamic is None:
            dynamic = lock_runs(cursor, runs)
        quiet = sorted(set(quiet) & set(dynamic) & set(runs))
        if quiet:
            freed, mapped_ended = mapping.settle(quiet, now)
            released += freed
            going_on = set(quiet) - set(mapped_ended)
            runs = [run_id for run_id in runs if run_id not in going_on]
            release = [run_id for run_id in release if run_id not in going_on]
        released += decide_children(cursor, release, sorted(set(dynamic) & set(release)), now,
                             None if ended is None else sorted(set(ended)))
        finished = []
        if runs:
            with db.cursor() as prepared:
                db.execute(prepared, FINISH_RUNS, {"runs": runs, "now": now})
                finished = prepared.fetchall()
    if finished:
        _runs_finished(finished, now)
    return released


def _runs_finished(finished: list[tuple], now: datetime) -> None:
    """Webhooks, callbacks and late-deadline marks of the workflow runs that ended (FINISH_RUNS'
    rows: id, state, workflow)."""
    tracing.runs_ended([run_id for run_id, _, _ in finished])
    ended = [(run_id, state) for run_id, state, workflow_id in finished if workflow_id]
    if not ended:
        return

    notifier.runs_finished(ended, now=now)
    callbacks.run_ended(ended, now=now)
    deadlines.finished_late([run_id for run_id, _ in ended])
