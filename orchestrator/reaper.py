"""The reaper: rescues attempts nobody will finish. An attempt whose worker's heartbeat is older
than HEARTBEAT_TIMEOUT_SECONDS (database clock) ends ``lost``; one running past its timeout plus
a margin (its worker should have killed it; the worker may be stuck) ends ``timed_out``. Both go
through the retry rule. The worker is marked ``lost``; if it was only paused, its guarded writes
for these attempts change nothing, and its next heartbeat tells it to kill them.

It also settles the maps a worker left unsettled when it died between recording a map's last
instances and settling the map (``SETTLE_MAPS``).
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import connection, transaction

from orchestrator import clock as clocks
from orchestrator import mapping, resolver
from orchestrator.channels import wake_due
from orchestrator.conf import app_settings
from orchestrator.loop import Loop, Role
from orchestrator.resolver import Ending
from orchestrator.states import (
    LIVE_WORKER_STATES,
    AttemptOutcome,
    TaskState,
    WorkerState,
    sql_list,
)

# --- SQL ---------------------------------------------------------------------------------------

# Live workers whose heartbeat is too old. Nobody can write a heartbeat while the database is down,
# so after a restart silence counts from the server's start (pg_postmaster_start_time(), or the
# test clock's stand-in): an outage longer than the timeout must not get every worker declared
# lost and every running task run a second time.
MARK_LOST = f"""
UPDATE orchestrator_worker SET state = '{WorkerState.LOST}', stopped_at = %(db_now)s
WHERE state IN ({sql_list(LIVE_WORKER_STATES)})
  AND GREATEST(heartbeat_at, COALESCE(%(server_started)s::timestamptz, pg_postmaster_start_time()))
      < %(db_now)s - make_interval(secs => %(timeout)s)
RETURNING id
"""

# Running attempts whose worker is gone (lost, stopped or deleted); the current attempt of a
# running task run only. Found from the task runs (taskrun_running: the running ones, by worker),
# not by an index of running attempts: such an index names the attempt's outcome, so the end of
# every attempt would have to write it and could never be a HOT update. Not locked here:
# end_attempts locks the runs first (the order every writer follows) and its guarded update lets
# only one of two reapers, or of a reaper and a late worker, end an attempt.
ORPHANED = f"""
SELECT a.task_run_id, a.number, a.log_path, t.run_id FROM orchestrator_taskrun t
JOIN orchestrator_attempt a ON a.task_run_id = t.id AND a.number = t.attempts
LEFT JOIN orchestrator_worker w ON w.id = t.worker_id
WHERE t.state = '{TaskState.RUNNING}' AND a.outcome = '{AttemptOutcome.RUNNING}'
  AND (w.id IS NULL OR w.state NOT IN ({sql_list(LIVE_WORKER_STATES)}))
"""

# Running attempts past their timeout plus the margin (the task run's start is its attempt's).
OVERDUE = f"""
SELECT a.task_run_id, a.number, a.log_path, t.timeout, t.run_id FROM orchestrator_taskrun t
JOIN orchestrator_attempt a ON a.task_run_id = t.id AND a.number = t.attempts
WHERE t.state = '{TaskState.RUNNING}' AND a.outcome = '{AttemptOutcome.RUNNING}' AND t.timeout IS NOT NULL
  AND a.started_at + make_interval(secs => t.timeout + %(margin)s) < %(now)s
"""


# Mapped tasks none of whose instances is left (active: waiting, due, running, ...), which the
# worker that ended their last instances did not settle: a worker records a map's instances
# without their run's lock and, where another transaction held the run at that moment, settles
# the map after its commit (worker.batch.Batch.settle); one that dies in between leaves the map
# waiting for nothing. Read from the mapped tasks (taskrun_mapped: only maps in progress), one
# probe of taskrun_active_instances each, so a pass costs the same beside a map of 100,000 items.
SETTLE_MAPS = f"""
SELECT DISTINCT m.run_id FROM orchestrator_taskrun m
WHERE m.state = '{TaskState.MAPPED}' AND m.map_index = -1 AND {mapping.ACTIVE_INSTANCE} IS NULL
"""


def settle_maps(clock=None) -> int:
    """Settle the maps whose instances all ended unsettled (SETTLE_MAPS); returns how many runs."""
    now = (clock or clocks.system).now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(SETTLE_MAPS)
        runs = [row[0] for row in cursor.fetchall()]
        if runs and resolver.settle_maps(runs, now=now):
            wake_due()
    return len(runs)


def reap_once(clock=None) -> int:
    """One pass; returns how many attempts were ended."""
    clock = clock or clocks.system
    timeout = app_settings.HEARTBEAT_TIMEOUT_SECONDS
    with transaction.atomic(), connection.cursor() as cursor:
        db_now = clock.db_now()
        now = clock.now()
        cursor.execute(MARK_LOST, {"db_now": db_now, "timeout": timeout, "server_started": clock.server_started})
        cursor.execute(ORPHANED)
        endings = [Ending(task_run_id, number, AttemptOutcome.LOST, error="lost: the worker stopped sending heartbeats",
                          log_path=log_path, run_id=run_id)
                   for task_run_id, number, log_path, run_id in cursor.fetchall()]
        cursor.execute(OVERDUE, {"now": now, "margin": max(timeout, 5.0)})
        seen = {e.task_run_id for e in endings}
        endings += [Ending(task_run_id, number, AttemptOutcome.TIMED_OUT,
                           error=f"timed out after {limit:g}s (ended by the reaper: its worker did not)",
                           log_path=log_path, run_id=run_id)
                    for task_run_id, number, log_path, limit, run_id in cursor.fetchall() if task_run_id not in seen]
        reaped = len(resolver.end_attempts(endings, now=now))
    # After that transaction, whose run locks were taken in one order: these are locked in another.
    settle_maps(clock)
    return reaped


class Reaper(Role):
    """``manage.py reaper``: a pass every ``interval`` seconds on the shared loop. The scheduler
    leader already reaps; this is for deployments that want it separate."""

    role = "reaper"

    def __init__(self, interval: float | None = None, clock=None, report: Callable[[int], None] | None = None):
        self.interval = interval or app_settings.HEARTBEAT_SECONDS
        self.clock = clock
        self.report = report

    def serve(self, max_seconds: float | None = None) -> None:
        Loop(self, poll=self.interval, max_seconds=max_seconds).run()

    def tick(self) -> bool:
        reaped = reap_once(clock=self.clock)
        if reaped and self.report:
            self.report(reaped)
        return False  # one pass per interval, whatever it found
