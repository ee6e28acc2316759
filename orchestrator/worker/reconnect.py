"""After a database outage, what the database says a worker runs and what its children run can
differ: this module reconciles the two (see ``reconcile``)."""

from __future__ import annotations

import logging

from django.db import connection

from orchestrator.states import TaskState
from orchestrator.worker.batch import Batch
from orchestrator.worker.drain import Drain, hand_back
from orchestrator.worker.pool import Pool

log = logging.getLogger(__package__)  # the worker's records under one name, orchestrator.worker

# --- SQL ---------------------------------------------------------------------------------------

# Task runs claimed by this worker that none of its children runs: a claim that committed while the
# connection broke, so the worker never heard back (see reconcile).
CLAIMED_NOT_RUNNING = f"""
SELECT id, attempts FROM orchestrator_taskrun
WHERE worker_id = %(worker)s AND state = '{TaskState.RUNNING}' AND id <> ALL (%(busy)s::bigint[])
"""


def reconcile(pool: Pool, batch: Batch, drain: Drain, also: set[int] = frozenset()) -> None:
    """The task runs the database says this worker runs, but none of its children does, are one
    of two things. An outcome recorded shortly before a crash, lost with the commits the server
    had not flushed yet (outcomes are written without waiting for the flush): recorded again
    from memory. A claim that committed while the connection broke, so the worker never heard
    back: handed back, it never started. ``also``: the task runs the worker runs elsewhere than in
    its children (the in-process executor) or holds for a child."""
    # Ours and accounted for: running in a child, ended with the outcome not yet recorded, or
    # interrupted by a drain and waiting to be handed back.
    busy = {slot.message["id"] for slot in pool.busy()} | set(also)
    busy |= {ending.task_run_id for ending in batch.endings} | {message["id"] for message in drain.interrupted}
    with connection.cursor() as cursor:
        cursor.execute(CLAIMED_NOT_RUNNING, {"worker": batch.worker_id, "busy": sorted(busy)})
        orphans = cursor.fetchall()
    recent = {(e.task_run_id, e.number): e for e, _size in batch.recorded}
    lost_outcomes = [recent[key] for key in orphans if key in recent]
    never_started = [{"id": task_run_id, "number": number} for task_run_id, number in orphans
                     if (task_run_id, number) not in recent]
    if lost_outcomes:
        log.warning("recording %d outcome(s) again: the database lost them in a crash", len(lost_outcomes),
                    extra={"action": "worker_outcomes_again"})
        batch.endings.extend(lost_outcomes)
    if never_started:
        batch.handed_back(never_started)
        hand_back(never_started, "the worker lost its database connection while claiming this task run; "
                                 "it never started and runs again without counting this attempt",
                  worker_id=batch.worker_id, queues=batch.queues)
