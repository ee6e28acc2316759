"""SIGTERM drains a worker: it claims nothing more, lets running tasks finish within the grace
period, then kills the rest and hands them back (due again at once, without counting the
interrupted attempt). A second SIGTERM ends the grace period at once."""

from __future__ import annotations

import logging

from django.db import connection, transaction

from orchestrator import clock
from orchestrator.channels import wake_due
from orchestrator.states import AttemptOutcome, TaskState, WorkerState
from orchestrator.worker import heartbeat
from orchestrator.worker.batch import Batch
from orchestrator.worker.pool import Pool

log = logging.getLogger(__package__)  # the worker's records under one name, orchestrator.worker

# --- SQL ---------------------------------------------------------------------------------------

# How long after the grace period a draining worker keeps trying to record outcomes and hand back
# its interrupted task runs while the database is away, before it leaves them to the reaper.
DRAIN_GIVE_UP_SECONDS = 10.0

# Interrupted by a shutdown (or never started, see worker.reconnect): due again now, and the interrupted
# attempt does not count against the task's allowance (max_attempts grows by one; attempt numbers
# stay unique and the history keeps the interrupted attempt).
HAND_BACK = f"""
UPDATE orchestrator_taskrun t SET state = '{TaskState.SCHEDULED}', due_at = %(now)s, max_attempts = t.max_attempts + 1
FROM unnest(%(ids)s::bigint[], %(numbers)s::int[]) AS u(id, number)
WHERE t.id = u.id AND (t.state = '{TaskState.RUNNING}' AND t.attempts = u.number AND t.worker_id = %(worker)s) IS TRUE
RETURNING t.id, t.attempts
"""
HAND_BACK_ATTEMPTS = f"""
UPDATE orchestrator_attempt a SET outcome = '{AttemptOutcome.LOST}', finished_at = %(now)s, error = %(error)s
FROM unnest(%(ids)s::bigint[], %(numbers)s::int[]) AS u(id, number)
WHERE a.task_run_id = u.id AND a.number = u.number AND (a.outcome = '{AttemptOutcome.RUNNING}') IS TRUE
"""


def hand_back(messages: list[dict], error: str, *, worker_id: int, queues: list[str]) -> None:
    """Make these task runs of this worker due again now, their attempts ended lost with ``error``."""
    params = {"ids": [m["id"] for m in messages], "numbers": [m["number"] for m in messages],
              "worker": worker_id, "now": clock.now(), "error": error}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(HAND_BACK, params)
        returned = cursor.fetchall()
        if returned:
            cursor.execute(HAND_BACK_ATTEMPTS, params)
            wake_due(queues)
    log.info("handed back %d unfinished task run(s)", len(returned), extra={"action": "worker_hand_back"})


class Drain:
    """The drain of one worker, from the first SIGTERM until nothing is left (``done``)."""

    def __init__(self, grace: float, pool: Pool, batch: Batch, inprocess=None):
        self.grace = grace
        self.pool, self.batch = pool, batch
        # What runs tasks: the forked children and, when the worker has one, the in-process executor.
        self.runners = [pool] + ([inprocess] if inprocess is not None else [])
        self.deadline: float | None = None  # the end of the grace period (time.monotonic())
        self.marked = False  # the worker's row says "draining"
        self.interrupted: list[dict] = []  # killed at the end of the grace period, not yet handed back
        self.done = False

    def busy_count(self) -> int:
        return sum(runner.busy_count() for runner in self.runners)

    @property
    def active(self) -> bool:
        return self.deadline is not None

    def begin(self, now: float) -> None:
        self.deadline = now + self.grace
        log.info("draining: %d running task(s), grace %.0fs", self.busy_count(), self.grace,
                 extra={"action": "worker_drain"})

    def hand_back_interrupted(self) -> None:
        """Hand back the attempts killed or never started (they run again without counting);
        waiting sensors' checks were no attempts: they are only due again now."""
        self.batch.release_checks([c for m in self.interrupted for c in m.get("checks", ())])
        attempts = [m for m in self.interrupted if "checks" not in m]
        if attempts:
            self.batch.handed_back(attempts)
            hand_back(attempts, "interrupted: the worker shut down before the task finished; it runs "
                                "again without counting this attempt",
                      worker_id=self.batch.worker_id, queues=self.batch.queues)
        self.interrupted = []

    def step(self, now: float, stop_requests: int) -> bool:
        """Record outcomes as they come; at the end of the grace period (or on a second signal)
        kill what still runs and hand it back. Done as soon as nothing is left."""
        if now > self.deadline + DRAIN_GIVE_UP_SECONDS and (self.batch.endings or self.interrupted):
            # The database has been away since the grace period ended: leave the rest to the
            # reaper (this worker's heartbeat stops, its attempts end lost and are retried).
            log.error("could not record %d outcome(s) and hand back %d task run(s): the database is "
                      "unavailable; the reaper will rescue them", len(self.batch.endings), len(self.interrupted),
                      extra={"action": "worker_gave_up"})
            self.done = True
            return False
        if not self.marked:
            heartbeat.set_state(self.batch.worker_id, WorkerState.DRAINING)
            self.marked = True
        if stop_requests > 1 or now >= self.deadline:
            # The grace period is over: kill what still runs; it is handed back below.
            for runner in self.runners:
                self.interrupted += runner.interrupt()
        did = False
        if self.batch.endings or self.batch.starts_due(now):
            self.batch.flush()
            did = True
        if self.interrupted:
            self.hand_back_interrupted()
            did = True
        self.done = not self.busy_count() and not self.batch.endings and not self.interrupted
        return did
