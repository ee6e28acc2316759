"""The worker: claims due task runs of its queues and runs them in a pool of child processes.

One loop, one thread. Each turn of the loop is at most one transaction that records the
outcomes that came back from the children (and resolves their runs) and claims as many queued
task runs as there are idle children that are ready (forked and waiting); it commits before any
child starts user code. Children are forked ahead and reused; a child whose task outlives its
timeout, or whose task run was cancelled, is killed (SIGKILL on its process group) and replaced.

The pool is elastic: it starts with ``--min-children`` children, forks more (up to
``--concurrency``) when work is queued and no child is free, and lets a child above the minimum
that idled ``ORCHESTRATOR_WORKER_CHILD_IDLE_SECONDS`` exit, so an idle worker holds little memory.

Children are also recycled, never while they run a task: after a sync (a new code generation,
see ``orchestrator.reload``) every idle child is replaced at once and every busy one when its
task ends, and a child that ran ``--max-tasks-per-child`` tasks is replaced once its outcome is
in. A recycled child is told to exit (and killed if it has not within ``RETIRE_SECONDS``); a
fresh fork runs the code now on disk.

Jobs run at least once: a worker can finish a task and die before recording it, and the reaper
then gives the task run another attempt. Task code must be idempotent.

SIGTERM drains: claim nothing more, let running tasks finish within the grace period, then kill
the rest and hand them back (see ``hand_back``). A second SIGTERM ends the grace period at once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Pipe

from django.db import connection, connections, transaction

from orchestrator import clock, db, due, executor, reload, resolver, taskcontext
from orchestrator.channels import (
    CANCEL_CHANNEL,
    CODE_CHANNEL,
    DUE_CHANNEL,
    queue_channel,
    wake_dispatchers,
    wake_due,
)
from orchestrator.conf import app_settings
from orchestrator.loop import DATABASE_ERRORS, SHORT_TRANSACTION, Loop, Role, first_line
from orchestrator.resolver import Ending
from orchestrator.states import LIVE_WORKER_STATES, AttemptOutcome, TaskState, WorkerState, sql_list

log = logging.getLogger(__name__)

# --- SQL ---------------------------------------------------------------------------------------

# The worker's claims and outcomes do not wait for the WAL flush. Safe because execution is at
# least once anyway: a commit lost in a database crash only means a task run is claimed or
# recorded again (the claim returns to "queued", the outcome's attempt is reaped and retried);
# never that work is lost. It takes the disk's fsync latency out of every batch (and no JIT).
ASYNC_COMMIT = SHORT_TRANSACTION
# While other children still run, a worker's batches are at least this far apart: outcomes and
# announced work that arrive meanwhile wait for the next one, so a busy worker records and claims
# many per transaction; one that flushed longer ago (light load) flushes at once.
COALESCE_SECONDS = 0.003
# The latest recorded outcomes a worker keeps, to record again those a database crash lost: a
# server's unflushed commits span well under a second (wal_writer_delay), far fewer outcomes than
# this at any throughput one worker reaches; the byte budget bounds the memory (results are JSON).
RECENT_OUTCOMES = 1000
RECENT_OUTCOMES_BYTES = 8 * 1024 * 1024
# How long after the grace period a draining worker keeps trying to record outcomes and hand back
# its interrupted task runs while the database is away, before it leaves them to the reaper.
DRAIN_GIVE_UP_SECONDS = 10.0
# How many task runs of these queues wait for a worker (queued, or due that no limit holds back),
# up to a bound: how many children to add when none is free (a poll alone is no evidence of work).
WAITING = f"""
WITH RECURSIVE {due.QUEUE_KEYS}
SELECT (SELECT count(*) FROM (
            SELECT 1 FROM orchestrator_taskrun
            WHERE state = '{TaskState.QUEUED}' AND queue = ANY (%(queues)s::text[]) LIMIT %(n)s) q)
     + (SELECT count(*) FROM (
            SELECT 1 FROM keys CROSS JOIN LATERAL (
                SELECT 1 FROM orchestrator_taskrun
                WHERE state = '{TaskState.SCHEDULED}' AND queue = keys.queue AND lane = keys.lane
                  AND tenant = keys.tenant AND priority = keys.priority AND due_at <= %(now)s LIMIT %(n)s
            ) d
            WHERE %(direct)s AND {due.UNLIMITED} LIMIT %(n)s) s)
"""

# A claim that came back short while due work remained (rows another worker held): look again after this.
RECHECK_SECONDS = 0.005
# How long a recycled (or, at shutdown, an idle) child has to exit once told to, before it is
# killed: an idle child exits at once, unless it is still importing the job modules again.
RETIRE_SECONDS = 5.0

REGISTER = f"""
INSERT INTO orchestrator_worker (name, host, pid, queues, concurrency, state, started_at, heartbeat_at)
VALUES (%s, %s, %s, %s, %s, '{WorkerState.RUNNING}', now(), now()) RETURNING id, {reload.CURRENT}
"""

# The heartbeat, on the database clock. No row: the reaper declared this worker lost. It reads the
# code generation too: a worker that missed the NOTIFY of a sync notices it here.
HEARTBEAT = f"""
UPDATE orchestrator_worker SET heartbeat_at = now()
WHERE id = %s AND state IN ({sql_list(LIVE_WORKER_STATES)}) RETURNING state, {reload.CURRENT}
"""

# Declared lost by the reaper during a pause: running again from now.
REVIVE = f"""
UPDATE orchestrator_worker SET state = '{WorkerState.RUNNING}', heartbeat_at = now(), stopped_at = NULL
WHERE id = %s AND state = '{WorkerState.LOST}'
"""

SET_STATE = "UPDATE orchestrator_worker SET state = %s, stopped_at = CASE WHEN %s THEN now() END WHERE id = %s"

# Claim up to n task runs of these queues: first the admitted ones (queued by the dispatcher under
# a limit), highest priority first, then due ones that no limit holds back straight from
# scheduled, in dispatch order (orchestrator.due: live lane first, tenants in turn, priority).
# Rows another worker is claiming are skipped. The attempt number is incremented here, so it
# identifies this claim.
CLAIM = f"""
WITH RECURSIVE admitted AS MATERIALIZED (
    -- One ordered index scan per queue (taskrun_queued), so the cost does not grow with the
    -- backlog; "queue = ANY (…)" would read and sort every queued row.
    SELECT x.id FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT id, priority FROM orchestrator_taskrun
        WHERE state = '{TaskState.QUEUED}' AND queue = q.name
        ORDER BY priority DESC, id
        LIMIT %(n)s
        FOR UPDATE SKIP LOCKED
    ) x
    ORDER BY x.priority DESC, x.id
    LIMIT %(n)s
), {due.QUEUE_KEYS}, {due.in_dispatch_order(f"%(direct)s AND {due.UNLIMITED}", "%(candidates)s")},
direct AS MATERIALIZED (
    -- Locked in dispatch order and no further than needed (the nested loop runs in place order
    -- and the limit stops it), so a worker claiming at the same moment takes the next ones
    -- rather than finding every candidate locked.
    SELECT l.id FROM (SELECT id, place FROM chosen ORDER BY place) c
    CROSS JOIN LATERAL (
        SELECT id FROM orchestrator_taskrun
        WHERE id = c.id AND (state = '{TaskState.SCHEDULED}') IS TRUE
        FOR UPDATE SKIP LOCKED
    ) l
    LIMIT %(n)s - (SELECT count(*) FROM admitted)
), t AS (
    UPDATE orchestrator_taskrun t
    SET state = '{TaskState.RUNNING}', attempts = t.attempts + 1, worker_id = %(worker)s, started_at = %(now)s,
        -- Work claimed straight from scheduled was admitted and claimed at once.
        queued_at = CASE WHEN t.state = '{TaskState.SCHEDULED}' THEN %(now)s ELSE t.queued_at END
    -- Rows are found by id (an array, so no plan can join the candidates to every task run). They
    -- are locked in the state they were read in, which the guard repeats.
    WHERE t.id = ANY (ARRAY(SELECT id FROM admitted UNION ALL SELECT id FROM direct))
      AND (t.state IN ('{TaskState.QUEUED}', '{TaskState.SCHEDULED}')) IS TRUE
    RETURNING t.id, t.run_id, t.task, t.attempts, t.spec, t.timeout, cardinality(t.upstream) > 0 AS has_parents
), a AS (
    -- The attempt row of each claim, in the same statement (one round trip per batch).
    INSERT INTO orchestrator_attempt (task_run_id, number, worker_id, outcome, started_at, error, traceback, log_path)
    SELECT id, attempts, %(worker)s, '{AttemptOutcome.RUNNING}', %(now)s, '', '', '' FROM t
), r AS (
    -- The first task start of a run is the run's start; schedule_delay counts from when it was due:
    -- the fire time of a scheduled run or a job's run_after (its logical date), the creation of any
    -- other (a manual or backfill run's logical date can be any date in the past or future).
    -- Run rows are locked in id order, like every other writer does (see resolver.LOCK_RUNS).
    UPDATE orchestrator_run SET started_at = %(now)s, schedule_delay = EXTRACT(EPOCH FROM %(now)s
        - CASE WHEN trigger IN ('schedule', 'job') THEN logical_date ELSE created_at END)
    WHERE id = ANY (ARRAY(SELECT id FROM orchestrator_run WHERE id = ANY (ARRAY(SELECT run_id FROM t))
                          AND started_at IS NULL ORDER BY id FOR NO KEY UPDATE))
), upcoming AS (
    -- When the next task run this worker may claim itself is due, the claimed ones left out (the
    -- statement's snapshot still sees them scheduled); NULL: none. Wanted after a short claim: to
    -- wait until then, or to look again soon when it is due already (rows another worker held).
    {due.earliest(f"%(direct)s AND {due.UNLIMITED}", leaving_out="ARRAY(SELECT id FROM t)")}
)
-- One row per claimed task run, each with the next due time; a single row of NULLs and the next
-- due time when nothing was claimed.
SELECT t.id, t.run_id, t.task, t.attempts, t.spec, t.timeout, t.has_parents, upcoming.next_due
FROM upcoming LEFT JOIN t ON true
"""

# How many candidates each key offers a claim of n: enough that workers claiming at the same
# moment each find n that the others do not hold.
CANDIDATES_PER_SLOT = 2

# Which of the task runs this worker is executing are still its own (not cancelled, not reaped).
STILL_MINE = f"""
SELECT t.id FROM orchestrator_taskrun t
JOIN unnest(%(ids)s::bigint[], %(numbers)s::int[]) AS u(id, number) ON t.id = u.id
WHERE (t.state = '{TaskState.RUNNING}' AND t.attempts = u.number AND t.worker_id = %(worker)s) IS TRUE
"""

# Task runs claimed by this worker that none of its children runs: a claim that committed while the
# connection broke, so the worker never heard back (see Worker.reconnected).
CLAIMED_NOT_RUNNING = f"""
SELECT id, attempts FROM orchestrator_taskrun
WHERE worker_id = %(worker)s AND state = '{TaskState.RUNNING}' AND id <> ALL (%(busy)s::bigint[])
"""

# Interrupted by a shutdown (or never started, see above): due again now, and the interrupted
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


def _json(value):
    return json.loads(value) if isinstance(value, str) else value


@dataclass
class Slot:
    pid: int
    conn: object
    message: dict | None = None
    deadline: float | None = None
    started: float = 0.0
    extra: dict = field(default_factory=dict)
    generation: int = 0  # the code generation the child was forked in
    tasks: int = 0  # tasks it completed
    ready: bool = False  # it said it is ready (set up, code read): only then is it given a task
    idle_since: float = 0.0


class Worker(Role):
    """The worker role on the shared loop (``orchestrator.loop``). Each tick takes named steps:
    end the tasks past their timeout, start or finish a drain, record outcomes and claim work in
    one transaction, and send the heartbeat when it is due."""

    role = "worker"

    def __init__(self, queues: list[str], concurrency: int = 4, grace: float = 30.0, poll: float | None = None,
                 name: str | None = None, max_tasks_per_child: int | None = None, min_children: int | None = None):
        if not queues:
            raise ValueError("a worker needs at least one queue (--queues default,batch)")
        if concurrency < 1:
            raise ValueError(f"--concurrency must be at least 1, got {concurrency}")
        if max_tasks_per_child is None:
            max_tasks_per_child = app_settings.WORKER_MAX_TASKS_PER_CHILD
        if max_tasks_per_child < 0:
            raise ValueError(f"--max-tasks-per-child must be 0 (never) or more, got {max_tasks_per_child}")
        if min_children is None:
            min_children = app_settings.WORKER_MIN_CHILDREN
        if min_children < 0:
            raise ValueError(f"--min-children must be 0 (all: a fixed pool) or more, got {min_children}")
        self.queues = queues
        # Queue channels: work of these queues became due (claimed here when no limit applies to it)
        # or was admitted under a limit; the due channel: work became due in queues not looked up.
        self.channels = [*(queue_channel(q) for q in queues), DUE_CHANNEL, CANCEL_CHANNEL, CODE_CHANNEL]
        self.concurrency = concurrency
        self.max_tasks_per_child = max_tasks_per_child
        self.min_children = min(min_children or concurrency, concurrency)
        self.child_idle_seconds = app_settings.WORKER_CHILD_IDLE_SECONDS
        self.code_generation = 0
        self.retiring: list[tuple[int, float]] = []  # (pid, kill after): recycled children told to exit
        self.grace = grace
        self.poll = poll if poll is not None else app_settings.POLL_SECONDS
        self.heartbeat_every = app_settings.HEARTBEAT_SECONDS
        self.host = socket.gethostname()
        # Unique per process even with --name: a restarted worker must not collide with its
        # previous row (kept as history).
        self.name = f"{name or self.host}:{os.getpid()}:{os.urandom(3).hex()}"
        self.id: int | None = None
        self.loop: Loop | None = None
        self.slots: list[Slot] = []
        self.endings: list[Ending] = []
        self.last_flush = -1e9  # time.monotonic() when the latest batch began
        # The latest outcomes recorded: a database crash can lose the last commits (written
        # without waiting for the WAL flush), and these are then recorded again (``reconnected``).
        self.recorded: deque[tuple[Ending, int]] = deque()
        self.recorded_bytes = 0
        self.limits: due.Limits | None = None
        self.limits_checked = -1e9
        self.want_claim = True
        self.last_claim = 0.0
        # When due work this worker may claim itself is next due (time.monotonic(); inf: none known):
        # a delayed job, a retry, or work held by another worker's claim a moment ago.
        self.next_due = float("inf")
        self.claimed_next_due = None
        self.next_heartbeat = 0.0
        self.drain_deadline: float | None = None
        self.drain_marked = False
        self.interrupted: list[dict] = []  # killed at the end of the grace period, not yet handed back
        self.drained = False
        self.completed = 0

    # --- lifecycle -----------------------------------------------------------------------------

    def serve(self, max_seconds: float | None = None) -> None:
        Loop(self, poll=self.poll, max_seconds=max_seconds).run()

    def start(self, loop: Loop) -> None:
        self.loop = loop
        if self.id is None:
            self.register()
        if not self.slots:
            reload.snapshot()  # what the children inherit, to tell later what changed on disk
            self.slots = [self.fork_child() for _ in range(self.min_children)]
            log.info("worker %s started: queues %s, concurrency %d (%d child process(es) forked ahead)%s", self.name,
                     ",".join(self.queues), self.concurrency, self.min_children,
                     f", max {self.max_tasks_per_child} tasks per child" if self.max_tasks_per_child else "",
                     extra={"action": "worker_start"})
        self.next_heartbeat = time.monotonic() + self.heartbeat_every

    def register(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(REGISTER, [self.name, self.host, os.getpid(), self.queues, self.concurrency])
            self.id, self.code_generation = cursor.fetchone()

    def fork_child(self) -> Slot:
        # Django's connection is closed before forking: a child must not share its socket (its
        # exit would otherwise end the parent's session). The LISTEN connection stays referenced
        # by the loop in the child, which never closes it and leaves with os._exit().
        connections.close_all()
        parent_conn, child_conn = Pipe(duplex=True)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            parent_conn.close()
            executor.child_main(child_conn, parent)
        child_conn.close()
        slot = Slot(pid=pid, conn=parent_conn, generation=self.code_generation)
        self.loop.watch(parent_conn, lambda _conn, slot=slot: self.on_child_ready(slot))
        return slot

    def kill_child(self, slot: Slot) -> None:
        self.loop.unwatch(slot.conn)
        try:
            os.killpg(slot.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(slot.pid, 0)
        except ChildProcessError:
            pass
        slot.conn.close()

    def replace_child(self, slot: Slot) -> None:
        self.kill_child(slot)
        index = self.slots.index(slot)
        self.slots[index] = self.fork_child()

    def stop(self) -> None:
        """On the way out: idle children exit, busy ones (only after a failed hand-back) are
        killed, and the worker's row says it stopped."""
        if self.loop is None:
            return
        for slot in self.slots:
            if slot.message is None:
                try:
                    slot.conn.send(None)
                except OSError:
                    pass
        deadline = time.monotonic() + RETIRE_SECONDS
        for slot in self.slots:
            if slot.message is not None:
                self.kill_child(slot)
            else:
                self._wait_exit(slot.pid, deadline)
                slot.conn.close()
        for pid, _ in self.retiring:
            self._wait_exit(pid, deadline)
        self.retiring = []
        if self.id is not None:
            try:
                with connection.cursor() as cursor:
                    cursor.execute(SET_STATE, [WorkerState.STOPPED, True, self.id])
            except DATABASE_ERRORS as exc:
                # The row keeps its old heartbeat: the reaper marks it lost and rescues its attempts.
                log.warning("could not mark worker %s stopped (%s)", self.name, first_line(exc),
                            extra={"action": "worker_db_error"})
        log.info("worker %s stopped after %d task runs", self.name, self.completed,
                 extra={"action": "worker_stop"})

    @staticmethod
    def _exited(pid: int) -> bool:
        """Whether the child has exited (and is reaped now: no zombie)."""
        try:
            return os.waitpid(pid, os.WNOHANG)[0] != 0
        except ChildProcessError:
            return True

    def _wait_exit(self, pid: int, deadline: float) -> None:
        """Wait for a child told to exit, until ``deadline``; then kill it."""
        while not self._exited(pid):
            if time.monotonic() >= deadline:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
                return
            time.sleep(0.01)

    # --- recycling -----------------------------------------------------------------------------

    def saw_generation(self, generation: int, *, read: bool = False) -> None:
        """A code generation from a NOTIFY (only a newer one counts: they may arrive late) or read
        from the database (``read``: whatever differs counts)."""
        if generation == self.code_generation or (not read and generation < self.code_generation):
            return
        self.code_generation = generation
        log.info("code generation %d: replacing %d idle child process(es) now and %d busy one(s) when their "
                 "task ends", generation, len(self.slots) - self.busy_count(), self.busy_count(),
                 extra={"action": "worker_code_generation", "generation": generation})
        pinned = reload.needing_restart()
        if pinned:
            log.warning("changed on disk since this worker started, not picked up until it restarts: %s",
                        ", ".join(pinned[:20]) + (", ..." if len(pinned) > 20 else ""),
                        extra={"action": "worker_restart_needed"})

    def due_for_replacement(self, slot: Slot) -> bool:
        return slot.generation != self.code_generation or \
            bool(self.max_tasks_per_child and slot.tasks >= self.max_tasks_per_child)

    def recycle_children(self, now: float) -> None:
        """Replace the idle children forked in an older code generation or that ran their share of
        tasks; a busy child is left alone until its outcome is in. At most one fork per child."""
        for slot in list(self.slots):
            if slot.message is None and self.due_for_replacement(slot):
                self.retire_child(slot, now)
        if self.retiring:
            self.reap_retired(now)

    def retire_child(self, slot: Slot, now: float, replace: bool = True) -> None:
        self.loop.unwatch(slot.conn)
        try:
            slot.conn.send(None)  # "exit": the child leaves its loop (and closes its connections)
        except OSError:
            pass
        slot.conn.close()
        self.retiring.append((slot.pid, now + RETIRE_SECONDS))
        if replace:
            self.slots[self.slots.index(slot)] = self.fork_child()
        else:
            self.slots.remove(slot)

    # --- the elastic pool ----------------------------------------------------------------------

    def resize_pool(self, now: float) -> None:
        """Grow when work waits and no child is free; shrink to the minimum after idling."""
        free = [slot for slot in self.slots if slot.message is None]
        room = self.concurrency - len(self.slots)
        if self.want_claim and room > 0 and not any(slot.ready for slot in free):
            starting = len(free)
            with connection.cursor() as cursor:
                cursor.execute(WAITING, {"queues": self.queues, "n": room + starting, "now": clock.now(),
                                         **self.limit_params()})
                queued = cursor.fetchone()[0]
            for _ in range(queued - starting):
                self.slots.append(self.fork_child())
            if not queued:
                self.want_claim = False  # nothing to claim until a NOTIFY or the next poll
            return
        surplus = len(self.slots) - self.min_children
        if surplus > 0:
            expired = [slot for slot in free if slot.ready and now - slot.idle_since >= self.child_idle_seconds]
            for slot in sorted(expired, key=lambda slot: slot.idle_since)[:surplus]:
                self.retire_child(slot, now, replace=False)

    def next_shrink(self) -> float | None:
        """When the longest-idle child above the minimum may exit."""
        if len(self.slots) <= self.min_children:
            return None
        idle = [slot.idle_since for slot in self.slots if slot.ready and slot.message is None]
        return min(idle) + self.child_idle_seconds if idle else None

    def reap_retired(self, now: float) -> None:
        still = []
        for pid, kill_after in self.retiring:
            if self._exited(pid):
                continue
            if now >= kill_after:
                self._wait_exit(pid, now)
                continue
            still.append((pid, kill_after))
        self.retiring = still

    # --- the tick: named steps -----------------------------------------------------------------

    def tick(self) -> bool:
        now = time.monotonic()
        self.end_overdue_tasks(now)
        if self.loop.stop_requests and self.drain_deadline is None:
            self.begin_drain(now)
        if self.drain_deadline is not None:
            if self.retiring:
                self.reap_retired(now)
            return self.drain_step(now)
        self.recycle_children(now)
        did = self.record_and_claim(now)
        self.resize_pool(now)
        self.heartbeat_if_due(now)
        return did

    def finished(self, stop_requests: int) -> bool:
        return self.drained

    def next_wait(self) -> float:
        """Until the heartbeat, the poll, a task's deadline, the end of the grace period, or the
        end of the short hold that batches outcomes, whichever is first."""
        now = time.monotonic()
        timeout = self.next_heartbeat - now
        if self.drain_deadline is not None:
            timeout = min(timeout, self.drain_deadline - now)
        else:
            timeout = min(timeout, self.last_claim + self.poll - now, self.next_due - now)
        deadlines = [slot.deadline for slot in self.slots if slot.deadline is not None]
        deadlines += [kill_after for _, kill_after in self.retiring]
        shrink = self.next_shrink() if self.drain_deadline is None else None
        if shrink is not None:
            deadlines.append(shrink)
        if deadlines:
            timeout = min(timeout, min(deadlines) - now)
        if (self.endings or (self.want_claim and self.idle_slots())) and self.drain_deadline is None:
            timeout = min(timeout, self.last_flush + COALESCE_SECONDS - now) if self.holding(now) else 0.0
        return max(0.0, timeout)

    def end_overdue_tasks(self, now: float) -> None:
        for slot in list(self.slots):
            if slot.deadline is not None and now >= slot.deadline:
                self.on_timeout(slot)

    def begin_drain(self, now: float) -> None:
        self.drain_deadline = now + self.grace
        log.info("draining: %d running task(s), grace %.0fs", self.busy_count(), self.grace,
                 extra={"action": "worker_drain"})

    def drain_step(self, now: float) -> bool:
        """While draining: record outcomes as they come; at the end of the grace period (or on a
        second signal) kill what still runs and hand it back. Done as soon as nothing is left."""
        if now > self.drain_deadline + DRAIN_GIVE_UP_SECONDS and (self.endings or self.interrupted):
            # The database has been away since the grace period ended: leave the rest to the
            # reaper (this worker's heartbeat stops, its attempts end lost and are retried).
            log.error("could not record %d outcome(s) and hand back %d task run(s): the database is "
                      "unavailable; the reaper will rescue them", len(self.endings), len(self.interrupted),
                      extra={"action": "worker_gave_up"})
            self.drained = True
            return False
        if not self.drain_marked:
            with connection.cursor() as cursor:
                cursor.execute(SET_STATE, [WorkerState.DRAINING, False, self.id])
            self.drain_marked = True
        if self.loop.stop_requests > 1 or now >= self.drain_deadline:
            self.interrupt_running()
        did = False
        if self.endings:
            self.flush()
            did = True
        if self.interrupted:
            self.hand_back()
            did = True
        self.drained = not self.busy_count() and not self.endings and not self.interrupted
        return did

    def record_and_claim(self, now: float) -> bool:
        """Record the outcomes gathered so far and refill the idle children, in one transaction.
        Outcomes wait a few milliseconds for their neighbours while other tasks still run, so one
        transaction records many of them (and refills all the freed children)."""
        if now - self.last_claim >= self.poll or now >= self.next_due:
            self.want_claim = True
            self.next_due = float("inf")
        idle = self.idle_slots()
        claim = len(idle) if self.want_claim else 0
        if not (self.endings or claim) or self.holding(now):
            return False
        claimed = self.flush(claim)
        if claim:
            self.last_claim = now
            self.want_claim = len(claimed) == claim  # a full batch: there may be more
            if not self.want_claim and self.claimed_next_due is not None:
                # Short: wait until the next due work of these queues; due already means rows that
                # another worker held a moment ago (look again soon, not in a busy loop).
                wait = (self.claimed_next_due - clock.now()).total_seconds()
                self.next_due = now + max(wait, RECHECK_SECONDS)
            for slot, message in zip(idle, claimed, strict=False):
                self.start_task(slot, message)
        return True

    def heartbeat_if_due(self, now: float) -> None:
        if now >= self.next_heartbeat:
            self.heartbeat()
            self.next_heartbeat = now + self.heartbeat_every

    def holding(self, now: float) -> bool:
        """Whether the next batch waits: the latest one began less than COALESCE_SECONDS ago and
        other children still run (their outcomes will join it). With none running, nothing would."""
        return self.busy_count() > 0 and self.drain_deadline is None and now - self.last_flush < COALESCE_SECONDS

    def idle_slots(self) -> list[Slot]:
        """The children ready for a task (a child still starting gets none: the claim would wait)."""
        return [slot for slot in self.slots if slot.ready and slot.message is None]

    def busy_count(self) -> int:
        return sum(1 for slot in self.slots if slot.message is not None)

    def reconnected(self) -> None:
        """After a database outage, the task runs the database says this worker runs, but none of
        its children does, are one of two things. An outcome recorded shortly before a crash,
        lost with the commits the server had not flushed yet (outcomes are written without
        waiting for the flush): recorded again from memory. A claim that committed while the
        connection broke, so the worker never heard back: handed back, it never started. Then
        look for work at once (NOTIFYs sent during the outage were lost)."""
        # Ours and accounted for: running in a child, ended with the outcome not yet recorded, or
        # interrupted by a drain and waiting to be handed back.
        busy = {slot.message["id"] for slot in self.slots if slot.message is not None}
        busy |= {ending.task_run_id for ending in self.endings} | {message["id"] for message in self.interrupted}
        with connection.cursor() as cursor:
            cursor.execute(CLAIMED_NOT_RUNNING, {"worker": self.id, "busy": sorted(busy)})
            orphans = cursor.fetchall()
        recent = {(e.task_run_id, e.number): e for e, _size in self.recorded}
        lost_outcomes = [recent[key] for key in orphans if key in recent]
        never_started = [{"id": task_run_id, "number": number} for task_run_id, number in orphans
                         if (task_run_id, number) not in recent]
        if lost_outcomes:
            log.warning("recording %d outcome(s) again: the database lost them in a crash", len(lost_outcomes),
                        extra={"action": "worker_outcomes_again"})
            self.endings.extend(lost_outcomes)
        if never_started:
            self._hand_back(never_started, "the worker lost its database connection while claiming this task run; "
                                           "it never started and runs again without counting this attempt")
        self.want_claim = True

    # --- children ------------------------------------------------------------------------------

    def start_task(self, slot: Slot, message: dict) -> None:
        slot.message = message
        slot.started = time.monotonic()
        timeout = message.get("timeout")
        slot.deadline = slot.started + timeout if timeout else None
        try:
            slot.conn.send(message)
        except OSError:
            self.child_died(slot)

    def on_child_ready(self, slot: Slot) -> None:
        try:
            reply = slot.conn.recv()
        except (EOFError, OSError):
            self.child_died(slot)
            return
        if not slot.ready:  # its first message: set up and ready for a task
            slot.ready = True
            slot.idle_since = time.monotonic()
            return
        # (task_run_id, number, outcome, result, error, traceback, log, metadata, exception class)
        self.add_ending(Ending(*reply, job=slot.message.get("spec", {}).get("call") == "job",
                               run_id=slot.message["run_id"]))
        slot.message = None
        slot.deadline = None
        slot.tasks += 1
        slot.idle_since = time.monotonic()

    def add_ending(self, ending: Ending) -> None:
        self.endings.append(ending)

    def child_died(self, slot: Slot) -> None:
        message = slot.message
        status = None
        try:
            _, status = os.waitpid(slot.pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if message is not None:
            how = f"signal {os.WTERMSIG(status)}" if status and os.WIFSIGNALED(status) else (
                f"exit code {os.WEXITSTATUS(status)}" if status else "an unknown cause")
            self.add_ending(Ending(message["id"], message["number"], AttemptOutcome.FAILED, run_id=message["run_id"],
                                       error=f"the task's process ended unexpectedly ({how})"))
        slot.message = None
        self.replace_child(slot)

    def on_timeout(self, slot: Slot) -> None:
        message = slot.message
        self.replace_child(slot)
        self.add_ending(Ending(
            message["id"], message["number"], AttemptOutcome.TIMED_OUT,
            error=f"timed out after {message['timeout']:g}s: the task's process was killed",
            log_path=self._existing_log(message), run_id=message["run_id"],
        ))

    @staticmethod
    def _existing_log(message: dict) -> str:
        from orchestrator import logs

        name = logs.name_for(message["run_id"], message["id"], message["number"])
        path = logs.local_path(name)
        return name if path and os.path.exists(path) else ""

    def notified(self, notifies: list) -> None:
        for note in notifies:
            if note.channel == CODE_CHANNEL:
                if note.payload.isdigit():
                    self.saw_generation(int(note.payload))
            elif note.channel != CANCEL_CHANNEL:
                self.want_claim = True
            elif not note.payload:
                self.check_ownership()
            else:
                self.on_cancelled(note.payload)

    def on_cancelled(self, payload: str) -> None:
        try:
            ids = set(json.loads(payload))
        except ValueError:
            return
        for slot in list(self.slots):
            if slot.message is not None and slot.message["id"] in ids:
                self.abandon(slot, "cancelled")

    def abandon(self, slot: Slot, why: str) -> None:
        """Kill a task whose attempt is no longer this worker's (cancelled or reaped)."""
        message = slot.message
        log.info("killing task run %s attempt %s: %s", message["id"], message["number"], why,
                 extra={"action": "task_killed"})
        slot.message = None
        slot.deadline = None
        self.replace_child(slot)
        self.endings = [e for e in self.endings if e.task_run_id != message["id"]]

    def heartbeat(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(HEARTBEAT, [self.id])
            row = cursor.fetchone()
            alive = row is not None
            if not alive:
                # Declared lost (a long pause): the reaper already gave these attempts to others.
                log.warning("this worker was declared lost; abandoning its running tasks",
                            extra={"action": "worker_revived"})
                cursor.execute(REVIVE, [self.id])
                cursor.execute(f"SELECT {reload.CURRENT}")
                row = (None, cursor.fetchone()[0])
        self.saw_generation(row[1], read=True)
        self.check_ownership()

    def check_ownership(self) -> None:
        """Kill the tasks whose attempts are no longer this worker's (cancelled or reaped)."""
        busy = [slot for slot in self.slots if slot.message is not None]
        if not busy:
            return
        with connection.cursor() as cursor:
            cursor.execute(STILL_MINE, {"ids": [s.message["id"] for s in busy],
                                        "numbers": [s.message["number"] for s in busy], "worker": self.id})
            mine = {row[0] for row in cursor.fetchall()}
        for slot in busy:
            if slot.message["id"] not in mine:
                self.abandon(slot, "its attempt was cancelled or reaped")

    # --- the transaction -----------------------------------------------------------------------

    def flush(self, claim: int = 0) -> list[dict]:
        """Record the outcomes gathered so far and claim up to ``claim`` task runs, in one
        transaction that commits before anything claimed starts."""
        endings, self.endings = self.endings, []
        self.last_flush = time.monotonic()
        now = clock.now()
        try:
            # One round trip sends the whole batch (db.pipeline): the outcomes' statements and the
            # claim; what the answers call for (children to release, callbacks) follows.
            with transaction.atomic(), db.pipeline(), db.cursor() as cursor:
                db.execute(cursor, ASYNC_COMMIT)
                sent = resolver.send_endings(endings, worker_id=self.id, now=now) if endings else None
                claiming = self.send_claim(claim, now) if claim else None
                if sent is not None:
                    resolver.receive_endings(sent)
                    if self.limited():
                        # Finished work frees concurrency-limit room: let the dispatchers look again.
                        wake_dispatchers()
                claimed = self.receive_claim(claiming) if claiming is not None else []
        except BaseException:
            # The database is away (a restart, a failover): keep the outcomes for the next try
            # after the loop reconnected, or the task runs would stay "running" under a live
            # worker that no reaper rescues.
            self.endings = endings + self.endings
            raise
        self.completed += len(endings)
        self.remember(endings)
        for ending in endings:
            if ending.outcome not in (AttemptOutcome.SUCCEEDED, AttemptOutcome.RESCHEDULED):
                log.warning("task run %s attempt %s %s: %s", ending.task_run_id, ending.number, ending.outcome,
                            ending.error.splitlines()[0] if ending.error else "",
                            extra={"action": "attempt_" + ending.outcome, "task_run_id": ending.task_run_id})
        return claimed

    def remember(self, endings: list[Ending]) -> None:
        for ending in endings:
            size = len(ending.result or "") + len(ending.metadata or "") + len(ending.error) + len(ending.traceback) + 200
            self.recorded.append((ending, size))
            self.recorded_bytes += size
        while self.recorded and (len(self.recorded) > RECENT_OUTCOMES or self.recorded_bytes > RECENT_OUTCOMES_BYTES):
            self.recorded_bytes -= self.recorded.popleft()[1]

    def current_limits(self) -> due.Limits:
        """The concurrency limits, read at most once per poll interval (so a limit edited in the admin
        applies within one, as it does for the dispatchers)."""
        if self.limits is None or time.monotonic() - self.limits_checked > self.poll:
            self.limits = due.load_limits()
            self.limits_checked = time.monotonic()
        return self.limits

    def limited(self) -> bool:
        """Whether any concurrency limit exists."""
        return not self.current_limits().none

    def limit_params(self) -> dict:
        """The claim's parameters for the limits: work under a limit is left to the dispatchers,
        all of it when a default limit makes every queue or tenant limited."""
        limits = self.current_limits()
        return {**limits.params(), "direct": not limits.every}

    def claim(self, n: int, now) -> list[dict]:
        """Claim up to ``n`` task runs (in the caller's transaction): their messages."""
        return self.receive_claim(self.send_claim(n, now))

    def send_claim(self, n: int, now):
        cursor = db.cursor()
        db.execute(cursor, CLAIM, {"queues": self.queues, "n": n, "candidates": n * CANDIDATES_PER_SLOT,
                                   "worker": self.id, "now": now, **self.limit_params()})
        return cursor

    def receive_claim(self, cursor) -> list[dict]:
        """The claimed task runs' messages; the next due time goes to ``claimed_next_due``."""
        with cursor:
            rows = cursor.fetchall()
        self.claimed_next_due = rows[0][-1] if rows else None
        messages = []
        for task_run_id, run_id, task, number, spec, timeout, has_parents, _ in rows:
            if task_run_id is None:
                continue
            spec = _json(spec)
            messages.append({
                "id": task_run_id, "run_id": run_id, "task": task, "number": number, "spec": spec,
                "timeout": timeout or spec.get("timeout"), "has_parents": has_parents,
            })
        if any(m["spec"].get("call") != "job" for m in messages):
            with connection.cursor() as context:
                taskcontext.fill(context, messages)
        return messages

    def interrupt_running(self) -> None:
        """The grace period is over: kill what still runs; ``hand_back`` then makes it due again."""
        for slot in [slot for slot in self.slots if slot.message is not None]:
            self.interrupted.append(slot.message)
            slot.message = None
            slot.deadline = None
            self.kill_child(slot)
            self.slots.remove(slot)

    def hand_back(self) -> None:
        self._hand_back(self.interrupted, "interrupted: the worker shut down before the task finished; it runs "
                                          "again without counting this attempt")
        self.interrupted = []

    def _hand_back(self, messages: list[dict], error: str) -> None:
        params = {"ids": [m["id"] for m in messages], "numbers": [m["number"] for m in messages],
                  "worker": self.id, "now": clock.now(), "error": error}
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(HAND_BACK, params)
            returned = cursor.fetchall()
            if returned:
                cursor.execute(HAND_BACK_ATTEMPTS, params)
                wake_due(self.queues)
        log.info("handed back %d unfinished task run(s)", len(returned), extra={"action": "worker_hand_back"})
