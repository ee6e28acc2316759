"""The worker's batch: one transaction records the outcomes that came back from the children
(and resolves their runs) and claims as many due task runs as there are idle children that are
ready; it commits before any child starts user code. One round trip carries the whole batch
(``db.pipeline``).

Waiting sensors' checks are claimed in the same transaction by a statement of their own
(``CLAIM_CHECKS``): no attempt, a lease on the row instead, many per child round trip.

Outcomes wait a few milliseconds for their neighbours while other tasks still run
(``COALESCE_SECONDS``), so a busy worker records and claims many per transaction. The latest
recorded outcomes are kept, to record again those a database crash lost (``recorded``).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections import deque
from datetime import datetime

from django.db import connection, transaction

from orchestrator import analyze, clock, db, due, reload, resolver, taskcontext, tracing
from orchestrator.channels import wake_dispatchers, wake_due
from orchestrator.loop import SHORT_TRANSACTION
from orchestrator.resolver import Ending
from orchestrator.states import AttemptOutcome, TaskState

log = logging.getLogger(__package__)  # the worker's records under one name, orchestrator.worker

# --- SQL ---------------------------------------------------------------------------------------

# The worker's claims and outcomes do not wait for the WAL flush. Safe because execution is at
# least once anyway: a commit lost in a database crash only means a task run is claimed or
# recorded again (the claim returns to "queued", the outcome's attempt is reaped and retried);
# never that work is lost. It takes the disk's fsync latency out of every batch (and no JIT).
ASYNC_COMMIT = SHORT_TRANSACTION

# While other children still run, a worker's batches are at least this far apart: outcomes that
# arrive meanwhile, and its claims while a backlog lasts, wait for the next one, so a busy worker
# records and claims many per transaction; one that flushed longer ago (light load) flushes at
# once. Work a notification announces for a free place never waits (Worker.holding): at 500 jobs/s
# the wait showed in the start delay's tail (p99 7.0-11.2 ms with it, 6.6-8.6 without), while
# batches under a backlog kept their size (the no-op throughput did not move).
COALESCE_SECONDS = 0.003

# While a worker's children each have a task claimed ahead waiting for them (a local queue, see
# worker.pool.PREFETCH_PER_CHILD), its batches are at least this far apart instead: no child waits
# for work meanwhile, and each batch records and claims many times more.
QUEUED_COALESCE_SECONDS = 0.03

# A batch's outcomes go to resolver.END_TASK_RUNS in statements of about this many, all in the
# batch's one round trip. That statement's cost is linear in its endings (its answer joins
# nothing): 1,000 job endings took 93-131 ms in statements of 50 and 94-125 ms in statements of
# 500 on an analyzed table, so the bound only keeps one statement's arrays (tracebacks, results)
# small. Chunks are cut between runs, in run id order, so every run is decided by one statement
# and the run locks are still taken in one order (ascending).
ENDINGS_PER_STATEMENT = 50

# The latest recorded outcomes a worker keeps, to record again those a database crash lost: a
# server's unflushed commits span well under a second (wal_writer_delay), far fewer outcomes than
# this at any throughput one worker reaches; the byte budget bounds the memory (results are JSON).
RECENT_OUTCOMES = 1000
RECENT_OUTCOMES_BYTES = 8 * 1024 * 1024

# Claim up to n task runs of these queues: first the admitted ones (queued by the dispatcher under
# a limit), highest priority first, then due ones that no limit holds back straight from
# scheduled, in dispatch order (orchestrator.due: live lane first, tenants in turn, priority).
# Rows another worker is claiming are skipped. The attempt number is incremented here, so it
# identifies this claim.
CLAIM = db.prepared(f"""
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
), picked AS MATERIALIZED (
    -- In dispatch order (admitted first, in theirs, then direct in place order): the answer comes
    -- in this order, and the worker starts what it claimed ahead in the order it comes.
    SELECT id, ord FROM unnest(ARRAY(SELECT id FROM admitted UNION ALL SELECT id FROM direct))
        WITH ORDINALITY AS p(id, ord)
), t AS (
    UPDATE orchestrator_taskrun t
    SET state = '{TaskState.RUNNING}', attempts = t.attempts + 1, worker_id = %(worker)s, started_at = %(now)s,
        -- Work claimed straight from scheduled was admitted and claimed at once.
        queued_at = CASE WHEN t.state = '{TaskState.SCHEDULED}' THEN %(now)s ELSE t.queued_at END
    -- Rows are found by id (an array, so no plan can join the candidates to every task run). They
    -- are locked in the state they were read in, which the guard repeats.
    WHERE t.id = ANY (ARRAY(SELECT id FROM picked))
      AND (t.state IN ('{TaskState.QUEUED}', '{TaskState.SCHEDULED}')) IS TRUE
    RETURNING t.id, t.run_id, t.task, t.attempts, t.spec, t.timeout, cardinality(t.upstream) > 0 AS has_parents,
              t.lane, t.priority
), a AS (
    -- The attempt row of each claim, in the same statement (one round trip per batch).
    INSERT INTO orchestrator_attempt (task_run_id, number, worker_id, outcome, started_at, error, traceback, log_path)
    SELECT id, attempts, %(worker)s, '{AttemptOutcome.RUNNING}', %(now)s, '', '', '' FROM t
), r AS (
    -- The first task start of a run is the run's start (resolver.RUN_STARTED). Run rows are
    -- locked in id order, like every other writer does (see resolver.LOCK_RUNS). Not when "start"
    -- is false: a worker writes its claims' run starts later, with their ends (RUN_STARTS).
    UPDATE orchestrator_run SET started_at = %(now)s, schedule_delay = {resolver.RUN_STARTED.format("%(now)s")}
    WHERE id = ANY (ARRAY(SELECT id FROM orchestrator_run WHERE %(start)s AND id = ANY (ARRAY(SELECT run_id FROM t))
                          AND started_at IS NULL ORDER BY id FOR NO KEY UPDATE))
), upcoming AS (
    -- When the next task run this worker may claim itself is due, the claimed ones left out (the
    -- statement's snapshot still sees them scheduled); NULL: none. Wanted after a short claim: to
    -- wait until then, or to look again soon when it is due already (rows another worker held).
    {due.earliest(f"%(direct)s AND {due.UNLIMITED}", leaving_out="ARRAY(SELECT id FROM t)")}
)
-- One row per claimed task run, in dispatch order, each with the next due time and the code
-- generation now (a sync that committed before this claim, its NOTIFY maybe not there yet:
-- Worker.record_and_claim); a single row of NULLs and those two when nothing was claimed.
SELECT t.id, t.run_id, t.task, t.attempts, t.spec, t.timeout, t.has_parents, t.lane, t.priority,
       -- Whether its run may not have started yet (a job's never has at its first claim; a task
       -- of a run of many, when no task of it started before): a start for RUN_STARTS.
       (t.spec->>'call') = 'job' OR NOT EXISTS (
           SELECT FROM orchestrator_run s WHERE s.id = t.run_id AND s.started_at IS NOT NULL) AS unstarted,
       upcoming.next_due, {reload.CURRENT} AS generation
FROM upcoming LEFT JOIN (t JOIN picked ON picked.id = t.id) ON true
ORDER BY picked.ord
""")

# The starts of the runs of task runs this worker claimed (Batch.starts), written after the claim:
# a claimed task run's state, attempt and start time are written by its claim, its run's start
# (started_at: the claim's time, and schedule_delay) by the end of a one-task job when that comes
# within START_SECONDS (resolver.END_TASK_RUNS, one row version of the run fewer per job), else by
# this statement in a batch after START_SECONDS, or in the batch that records the end of another
# task of the run. Only while the claim is still this worker's (a task run handed back is not
# started), and only a run not started yet (the earliest claim of its first tasks); run rows
# locked in id order, after the endings' (as the claim's were).
RUN_STARTS = db.prepared(f"""
WITH s AS (
    SELECT s.run_id, min(s.at) AS at
    FROM unnest(%(runs)s::bigint[], %(task_runs)s::bigint[], %(numbers)s::int[], %(ats)s::timestamptz[])
        AS s(run_id, task_run_id, number, at)
    JOIN orchestrator_taskrun t ON t.id = s.task_run_id AND t.attempts = s.number AND t.worker_id = %(worker)s
    GROUP BY s.run_id
)
UPDATE orchestrator_run r SET started_at = s.at, schedule_delay = {resolver.RUN_STARTED.format("s.at")}
FROM s
WHERE r.id = s.run_id AND r.id = ANY (ARRAY(SELECT id FROM orchestrator_run WHERE id = ANY (ARRAY(SELECT run_id FROM s))
                                           AND started_at IS NULL ORDER BY id FOR NO KEY UPDATE))
""")

# How long a claimed task run's run start waits to be written with its end (RUN_STARTS): no-op
# jobs end within a batch or two; one that runs longer shows its run's start after this.
START_SECONDS = 0.2

# Waiting sensors' checks due now, of these queues, in due order: up to n, claimed without an
# attempt (a check is not an attempt) and with a lease instead of a state change. The sensor stays
# "sensing"; its due time moves a lease ahead and it is marked this worker's, so a worker that dies
# mid-check costs only a late check (it comes due again when the lease ends) and a second claim
# after the lease is told apart by the check count (resolver.END_TASK_RUNS). Concurrency limits
# applied to the sensor's first check (an attempt); its later checks hold no slot between them and
# are not counted against them. With the next due check of these queues, the claimed ones left out.
CLAIM_CHECKS = db.prepared(f"""
WITH c AS MATERIALIZED (
    SELECT x.id FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL (
        -- One ordered index scan per queue (taskrun_sensing).
        SELECT id, due_at FROM orchestrator_taskrun
        WHERE state = '{TaskState.SENSING}' AND queue = q.name AND due_at <= %(now)s
        ORDER BY due_at
        LIMIT %(n)s
        FOR UPDATE SKIP LOCKED
    ) x
    ORDER BY x.due_at
    LIMIT %(n)s
), t AS (
    UPDATE orchestrator_taskrun t SET worker_id = %(worker)s, due_at = %(now)s + make_interval(secs => %(lease)s)
    WHERE t.id = ANY (ARRAY(SELECT id FROM c)) AND (t.state = '{TaskState.SENSING}') IS TRUE
    RETURNING t.id, t.run_id, t.task, t.attempts, t.checks, t.spec, t.timeout, cardinality(t.upstream) > 0 AS has_parents
), upcoming AS (
    SELECT min(u.due_at) AS next_due FROM unnest(%(queues)s::text[]) AS q(name) CROSS JOIN LATERAL (
        SELECT due_at FROM orchestrator_taskrun
        WHERE state = '{TaskState.SENSING}' AND queue = q.name AND id <> ALL (ARRAY(SELECT id FROM c))
        ORDER BY due_at LIMIT 1
    ) u
)
SELECT t.id, t.run_id, t.task, t.attempts, t.checks, t.spec, t.timeout, t.has_parents, upcoming.next_due
FROM upcoming LEFT JOIN t ON true
""")

# Claimed checks this worker will not run (it is shutting down): due again now, for any worker,
# instead of at the end of their lease.
RELEASE_CHECKS = f"""
UPDATE orchestrator_taskrun SET due_at = %(now)s
WHERE id = ANY (%(ids)s::bigint[]) AND (state = '{TaskState.SENSING}' AND worker_id = %(worker)s) IS TRUE
"""

# How long a claimed check is this worker's before any worker may claim it again (its due time
# moves this far ahead at the claim). Longer than a batch of checks may run (see CHECKS_PER_CHILD).
CHECK_LEASE_SECONDS = 600

# How many checks one child runs per round trip: a batch is one message to a child and one reply.
CHECKS_PER_CHILD = 50

# While checks come due one after another (10,000 sensors at every=60: one every 6 ms), a worker
# claims them at most this often, so each claim and each round trip to a child carries many: a
# check is then up to this late, against a parent that would otherwise claim a check or two at a
# time, all the time.
CHECK_GATHER_SECONDS = 0.25

# What a check may take when its sensor sets no timeout (poke_timeout=None).
CHECK_TIMEOUT_SECONDS = 60

# How many candidates each key offers a claim of n: enough that workers claiming at the same
# moment each find n that the others do not hold.
CANDIDATES_PER_SLOT = 2

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


def chunks(endings: list[Ending]) -> list[list[Ending]]:
    """The endings in run id order, cut between runs into lists of about ENDINGS_PER_STATEMENT."""
    parts: list[list[Ending]] = []
    last = object()
    for ending in sorted(endings, key=lambda e: (e.run_id is None, e.run_id or 0)):
        if not parts or (len(parts[-1]) >= ENDINGS_PER_STATEMENT and ending.run_id != last and ending.run_id is not None):
            parts.append([])
        parts[-1].append(ending)
        last = ending.run_id
    return parts


def _json(value):
    """A claimed task run's spec (JSON text from the raw cursor): jobs of one kind share one text,
    so the parse of a short one is kept for the next claims (a long one, large arguments, is not
    kept in memory). Each message gets its own top-level dict; the values inside (the arguments)
    are shared, and nothing in the worker writes to them."""
    if not isinstance(value, str):
        return value
    return dict(_parsed(value)) if len(value) <= PARSED_SPEC_CHARS else json.loads(value)


# The longest spec text whose parse is kept (``_json``): a job's spec without large arguments.
PARSED_SPEC_CHARS = 4096


@functools.lru_cache(maxsize=256)
def _parsed(text: str) -> dict:
    return json.loads(text)


class Batch:
    """What one worker records and claims, and what it remembers of it."""

    def __init__(self, queues: list[str], poll: float):
        self.queues = queues
        self.poll = poll  # how long the limits read last
        self.worker_id: int | None = None
        self.endings: list[Ending] = []  # outcomes not recorded yet
        self.last_flush = -1e9  # time.monotonic() when the latest batch began
        # The latest outcomes recorded: a database crash can lose the last commits (written
        # without waiting for the WAL flush), and these are then recorded again (worker.reconnect).
        self.recorded: deque[tuple[Ending, int]] = deque()
        self.recorded_bytes = 0
        self.limits: due.Limits | None = None
        self.limits_checked = -1e9
        # When the next task run this worker may claim itself is due, and the code generation, as
        # the latest claim found them.
        self.claimed_next_due = None
        self.claimed_generation: int | None = None
        self.unstarted: set[int] = set()  # the latest claim's task runs whose run may not have started (CLAIM)
        # Runs whose maps are settled after the batch that ended their instances (see settle).
        self.unsettled: set[int] = set()
        # When the next waiting sensor's check of these queues is due (as the latest check claim found it).
        self.checks_next_due = None
        # The claimed task runs whose run start is not written yet (RUN_STARTS), by id, in claim
        # order: (run id, attempt number, the claim's time, when to write it at the latest, in
        # time.monotonic()).
        self.starts: dict[int, tuple[int, int, datetime, float]] = {}
        self.completed = 0
        self.freshness = analyze.Freshness()  # the job tables' statistics, analyzed once they doubled

    def add(self, ending: Ending) -> None:
        self.endings.append(ending)

    def forget(self, task_run_id: int) -> None:
        """Drop the outcomes of a task run no longer this worker's (cancelled or reaped)."""
        self.endings = [e for e in self.endings if e.task_run_id != task_run_id]
        self.starts.pop(task_run_id, None)

    def handed_back(self, messages: list[dict]) -> None:
        """These claimed task runs never started here: their runs did not start (RUN_STARTS)."""
        for message in messages:
            self.starts.pop(message["id"], None)

    def starts_due(self, now: float) -> bool:
        """Whether a claimed task run's run start waited START_SECONDS for its end (RUN_STARTS)."""
        return bool(self.starts) and now >= self.starts_due_at()

    def starts_due_at(self) -> float:
        """When the oldest claim's run start is due (``starts`` keeps claim order)."""
        return next(iter(self.starts.values()))[3] if self.starts else float("inf")

    def coalescing(self, now: float, queued: bool = False) -> bool:
        """Whether the latest batch began less than its hold ago: COALESCE_SECONDS, or
        QUEUED_COALESCE_SECONDS while every child has a job ``queued`` for it."""
        return now < self.hold_until(queued)

    def hold_until(self, queued: bool = False) -> float:
        return self.last_flush + (QUEUED_COALESCE_SECONDS if queued else COALESCE_SECONDS)

    def flush(self, claim: int = 0, checks: int = 0) -> list[dict]:
        """Record the outcomes gathered so far and claim up to ``claim`` task runs and up to
        ``checks`` waiting sensors' checks (their messages have a "check"), in one transaction
        that commits before anything claimed starts."""
        self.freshness.check(time.monotonic())  # before this batch's statements are planned
        self.settle()  # what a failed try left (its transaction is its own)
        endings, self.endings = self.endings, []
        self.last_flush = time.monotonic()
        now = clock.now()
        carried, starting = self.starts_to_write(endings, self.last_flush)
        # The limits are read (at most once per poll interval) before the batch's pipeline, in
        # which each of their queries would wait for its answer.
        self.current_limits()
        try:
            # The whole batch is sent at once (db.pipeline), its transaction's BEGIN included
            # (db.atomic): the outcomes' statements, the run starts and the claim. When nothing
            # read can call for another statement (no outcome, or only plain jobs' successes:
            # ``quiet``), the COMMIT goes with them and the answers are read after the pipeline's
            # end, one round trip for the batch (a wake-up of the dispatchers under a limit is sent
            # after it). Else what the outcomes' answers call for (children to release, callbacks,
            # a retry's wake-up) follows, then the COMMIT: two round trips.
            quiet = all(e.plain and e.outcome == AttemptOutcome.SUCCEEDED and e.check is None for e in endings)
            with db.atomic() as outermost, db.cursor() as cursor:
                with db.pipeline():
                    if outermost:
                        db.execute(cursor, db.BEGIN)
                    db.execute(cursor, ASYNC_COMMIT)
                    sent = [resolver.send_endings(chunk, worker_id=self.worker_id, now=now)
                            for chunk in chunks(endings)]
                    if starting:
                        self.send_starts(cursor, starting)
                    claiming = self.send_claim(claim, now, start=False) if claim else None
                    checking = self.send_checks(checks, now) if checks else None
                    if outermost and quiet:
                        db.execute(cursor, db.COMMIT)
                    else:
                        claimed = self.receive(claiming, checking, sent)
                        if outermost and not connection.needs_rollback:
                            db.execute(cursor, db.COMMIT)
                if outermost and quiet:
                    claimed = self.receive(claiming, checking, sent)
        except BaseException:
            # The database is away (a restart, a failover): keep the outcomes for the next try
            # after the loop reconnected, or the task runs would stay "running" under a live
            # worker that no reaper rescues.
            self.endings = endings + self.endings
            raise
        for each in sent:
            self.unsettled.update(each.deferred)
        for task_run_id in carried + starting:
            self.starts.pop(task_run_id, None)
        for message in claimed:
            if message["id"] in self.unstarted and "check" not in message:
                self.starts.pop(message["id"], None)  # (kept in claim order)
                self.starts[message["id"]] = (message["run_id"], message["number"], now,
                                              self.last_flush + START_SECONDS)
        tracing.claimed([m for m in claimed if "check" not in m], now, self.worker_id)
        self.completed += len(endings)
        self.remember(endings)
        for ending in endings:
            if ending.outcome not in (AttemptOutcome.SUCCEEDED, AttemptOutcome.RESCHEDULED):
                log.warning("task run %s attempt %s %s: %s", ending.task_run_id, ending.number, ending.outcome,
                            ending.error.splitlines()[0] if ending.error else "",
                            extra={"action": "attempt_" + ending.outcome, "task_run_id": ending.task_run_id})
        return claimed

    def receive(self, claiming, checking, sent: list) -> list[dict]:
        """The batch's answers: the claimed task runs' and checks' messages; what the outcomes'
        answers call for is done (in the batch's transaction while it is open)."""
        # The claim's answer (and its context) first: a map's instances' endings take their run's
        # lock only now (resolver.TRY_LOCK_RUNS), so it is held to the commit through their
        # settling alone.
        claimed = self.receive_claim(claiming) if claiming is not None else []
        claimed += self.receive_checks(checking) if checking is not None else []
        for each in sent:
            resolver.receive_endings(each)
        if sent and self.limited():
            # Finished work frees concurrency-limit room: let the dispatchers look again.
            wake_dispatchers()
        return claimed

    def starts_to_write(self, endings: list[Ending], now: float) -> tuple[list[int], list[int]]:
        """The claimed task runs whose run start this batch writes: those whose one-task job's
        ending carries it (Ending.started: resolver.END_TASK_RUNS writes it, with the run's end
        when the job ended), and, by RUN_STARTS, the other ended ones and those whose start waited
        START_SECONDS."""
        carried, ended = [], set()
        for ending in endings:
            start = self.starts.get(ending.task_run_id)
            if start is None or ending.number != start[1] or ending.check is not None:
                continue
            if ending.job and ending.run_id is not None:
                ending.started = start[2]
                carried.append(ending.task_run_id)
            else:
                ended.add(ending.task_run_id)
        for task_run_id, (*_, due_at) in self.starts.items():  # in claim order: the due ones first
            if due_at > now:
                break
            ended.add(task_run_id)
        return carried, sorted(ended.difference(carried))

    def send_starts(self, cursor, task_runs: list[int]) -> None:
        starts = [self.starts[task_run_id] for task_run_id in task_runs]
        db.execute(cursor, RUN_STARTS, {"runs": [s[0] for s in starts], "task_runs": task_runs,
                                        "numbers": [s[1] for s in starts], "ats": [s[2] for s in starts],
                                        "worker": self.worker_id})

    def settle(self) -> None:
        """Settle the maps whose instances' endings committed while another transaction held
        their run (``resolver.settle_maps``), in a transaction of its own: it waits for that
        holder, which could not see those endings. Called once the claimed work has started;
        kept for the next try when the database is away. A worker that dies first leaves them
        to the reaper (``reaper.SETTLE_MAPS``)."""
        if not self.unsettled:
            return
        runs = sorted(self.unsettled)
        with transaction.atomic(), db.cursor() as cursor:
            db.execute(cursor, ASYNC_COMMIT)
            released = resolver.settle_maps(runs, now=clock.now())
        self.unsettled.difference_update(runs)
        if released:
            wake_due()

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
        """Claim up to ``n`` task runs, then, for the rest, waiting sensors' checks (in the
        caller's transaction): their messages. ``claimed_next_due``: the next of either."""
        messages = self.receive_claim(self.send_claim(n, now))
        if len(messages) < n:
            messages += self.receive_checks(self.send_checks(n - len(messages), now))
            dues = [due for due in (self.claimed_next_due, self.checks_next_due) if due is not None]
            self.claimed_next_due = min(dues) if dues else None
        return messages

    def send_checks(self, n: int, now):
        cursor = db.cursor()
        db.execute(cursor, CLAIM_CHECKS, {"queues": self.queues, "n": n, "worker": self.worker_id, "now": now,
                                          "lease": CHECK_LEASE_SECONDS})
        return cursor

    def receive_checks(self, cursor) -> list[dict]:
        """The claimed checks' messages (each with "check": the check count it was claimed at);
        the next due check goes to ``checks_next_due``."""
        with cursor:
            rows = cursor.fetchall()
        self.checks_next_due = rows[0][-1] if rows else None
        messages = []
        for task_run_id, run_id, task, number, checks, spec, timeout, has_parents, _ in rows:
            if task_run_id is None:
                continue
            spec = _json(spec)
            messages.append({
                "id": task_run_id, "run_id": run_id, "task": task, "number": number, "spec": spec, "check": checks,
                "timeout": timeout or spec.get("timeout"), "has_parents": has_parents,
            })
        if any(m["spec"].get("call") != "job" for m in messages):
            taskcontext.fill(messages)
        return messages

    def send_claim(self, n: int, now, start: bool = True):
        """CLAIM; ``start`` False: the claimed task runs' run starts are left to RUN_STARTS."""
        cursor = db.cursor()
        db.execute(cursor, CLAIM, {"queues": self.queues, "n": n, "candidates": n * CANDIDATES_PER_SLOT,
                                   "worker": self.worker_id, "now": now, "start": start, **self.limit_params()})
        return cursor

    def receive_claim(self, cursor) -> list[dict]:
        """The claimed task runs' messages; the next due time goes to ``claimed_next_due``."""
        with cursor:
            rows = cursor.fetchall()
        self.claimed_next_due, self.claimed_generation = rows[0][-2:] if rows else (None, None)
        messages = []
        self.unstarted = set()
        for task_run_id, run_id, task, number, spec, timeout, has_parents, lane, priority, unstarted, _, _ in rows:
            if task_run_id is None:
                continue
            if unstarted:
                self.unstarted.add(task_run_id)
            spec = _json(spec)
            messages.append({
                "id": task_run_id, "run_id": run_id, "task": task, "number": number, "spec": spec,
                "timeout": timeout or spec.get("timeout"), "has_parents": has_parents, "rank": (lane, -priority),
            })
        if any(m["spec"].get("call") != "job" for m in messages):
            taskcontext.fill(messages)
        return messages

    def release_checks(self, checks: list[dict], now=None) -> None:
        """Give back claimed checks that will not run here (RELEASE_CHECKS)."""
        if checks:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(RELEASE_CHECKS, {"ids": [c["id"] for c in checks], "worker": self.worker_id,
                                                "now": now or clock.now()})

    def waiting(self, n: int) -> int:
        """How many task runs of these queues wait for a worker, counted up to ``n``."""
        with connection.cursor() as cursor:
            cursor.execute(WAITING, {"queues": self.queues, "n": n, "now": clock.now(), **self.limit_params()})
            return cursor.fetchone()[0]
