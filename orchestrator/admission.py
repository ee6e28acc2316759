"""Admission: whether a new run starts now or waits, one rule for every creator of runs. A trigger
from the UI, the API or the admin, a schedule's fire time, a data event and a backfill (its new
runs and the runs it reprocesses) ask ``Door.admit`` (``runs.create_run`` and ``runs.insert_runs``
ask for their callers); the scheduler starts the runs that waited (``releasable``). Callbacks,
one-off jobs and ``wf.test()`` runs have no workflow: nothing holds them back.

The rule, for a workflow with ``max_active_runs``:

* Every running run of the workflow counts, whatever made it: backfills included, as Airflow's
  backfills count by default.
* First come, first started: a new run starts at once when the workflow has room for it after the
  runs that wait ahead of it (running + waiting ahead < ``max_active_runs``); room that frees is
  theirs first. Runs wait in two lanes, as work is dispatched: a live run waits only behind
  waiting live runs, a backfill run behind every waiting run, so a backfill of a thousand runs
  holds live runs back by no more than the backfill runs already running.
* Otherwise it is created ``pending``, its reason saying so; as room frees, the scheduler starts
  the waiting runs in that order: live lane first, then the oldest (by id, the order they came in).
* A run held by its schedule's overlap policy (``buffer_one``: waiting for the schedule's active
  run to end) is not waiting for room: it holds no other run back and takes room only when its
  schedule lets it go.

Exact under concurrency: deciding for a workflow takes a transaction-level advisory lock (workflows
in id order, all before any run is inserted), held to commit, so two triggers at the same instant
cannot both take the last place. A workflow without ``max_active_runs`` takes no lock and reads
nothing. The reads follow the active runs, never the history nor the backlog: the running runs
of a limited workflow (``run_running_of_workflow``, about ``max_active_runs`` rows) and its
waiting runs up to ``max_active_runs`` of them (``run_pending_of_workflow``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db import connection

from orchestrator.states import Lane, Overlap, RunState

# --- SQL ---------------------------------------------------------------------------------------

# A waiting run ``r`` that its schedule's overlap policy holds: an earlier run of the schedule is
# still running.
_HELD_BY_SCHEDULE = f"""(r.schedule_id IS NOT NULL AND EXISTS (
        SELECT 1 FROM orchestrator_schedule s WHERE s.id = r.schedule_id AND s.overlap <> '{Overlap.ALLOW}'
           AND EXISTS (SELECT 1 FROM orchestrator_run o
                       WHERE o.schedule_id = r.schedule_id AND o.state = '{RunState.RUNNING}')))"""

# Serialize admission per workflow, in id order (so two transactions never wait on each other in
# a cycle), until commit: the next one to decide counts the runs this one started.
LOCK = ("SELECT pg_advisory_xact_lock(hashtextextended('orchestrator.admission.' || id, 0)) "
        "FROM unnest(%s::bigint[]) WITH ORDINALITY AS u(id, i) ORDER BY i")

# Of the limited ones among these workflows: the cap, how many runs are running, and how many
# wait for room in the live lane and in all (counted up to the cap: beyond it the answer is the same).
ROOM = f"""
SELECT f.id, f.max_active_runs,
       (SELECT count(*) FROM orchestrator_run r WHERE r.workflow_id = f.id AND r.state = '{RunState.RUNNING}'),
       (SELECT count(*) FROM (SELECT 1 FROM orchestrator_run r
         WHERE r.workflow_id = f.id AND r.state = '{RunState.PENDING}' AND r.lane = {Lane.LIVE}
           AND NOT {_HELD_BY_SCHEDULE} LIMIT f.max_active_runs) live),
       (SELECT count(*) FROM (SELECT 1 FROM orchestrator_run r
         WHERE r.workflow_id = f.id AND r.state = '{RunState.PENDING}' AND NOT {_HELD_BY_SCHEDULE}
         LIMIT f.max_active_runs) every)
FROM orchestrator_workflow f
WHERE f.id = ANY (%s) AND f.max_active_runs > 0
"""

# The workflows that have waiting runs, with their cap (NULL: none): a loose index scan over
# run_pending_of_workflow, one probe per such workflow however many runs wait.
WAITING_WORKFLOWS = f"""
WITH RECURSIVE w AS (
    (SELECT workflow_id FROM orchestrator_run WHERE state = '{RunState.PENDING}' AND workflow_id IS NOT NULL
     ORDER BY workflow_id LIMIT 1)
    UNION ALL
    SELECT n.workflow_id FROM w CROSS JOIN LATERAL (
        SELECT workflow_id FROM orchestrator_run
        WHERE state = '{RunState.PENDING}' AND workflow_id > w.workflow_id
        ORDER BY workflow_id LIMIT 1
    ) n
)
SELECT w.workflow_id, NULLIF(f.max_active_runs, 0) FROM w JOIN orchestrator_workflow f ON f.id = w.workflow_id
"""

# The waiting runs that may start now: of each workflow, as many as it has room for (all of them
# without a cap), live lane first, then the oldest, passing over those their schedule holds.
# Locked; a run a cancel holds is passed over, not waited for.
RELEASABLE = f"""
SELECT p.id FROM unnest(%(workflows)s::bigint[], %(room)s::bigint[]) AS w(id, room)
CROSS JOIN LATERAL (
    SELECT r.id, r.lane FROM orchestrator_run r
    WHERE r.workflow_id = w.id AND r.state = '{RunState.PENDING}' AND NOT {_HELD_BY_SCHEDULE}
    ORDER BY r.lane, r.id
    LIMIT w.room
    FOR UPDATE OF r SKIP LOCKED
) p
ORDER BY p.lane, p.id
LIMIT %(limit)s
"""

RUNNING_OF = f"""
SELECT workflow_id, count(*) FROM orchestrator_run
WHERE workflow_id = ANY (%s) AND state = '{RunState.RUNNING}' GROUP BY workflow_id
"""


@dataclass(frozen=True)
class Admission:
    """The state a new run starts in, and why (empty when it starts)."""

    state: str
    reason: str = ""


START = Admission(RunState.RUNNING)


@dataclass
class _Room:
    cap: int
    running: int
    waiting_live: int  # runs waiting for room in the live lane
    waiting: int  # in every lane

    def ahead(self, lane: int) -> int:
        """How many waiting runs a new run of ``lane`` waits behind."""
        return self.waiting_live if lane == Lane.LIVE else self.waiting


def _lock(cursor, workflow_ids) -> None:
    if workflow_ids:
        cursor.execute(LOCK, [sorted(workflow_ids)])


class Door:
    """The admission of new runs of some workflows, in the caller's transaction: their counts are
    read once, under the workflows' locks, then kept as runs are admitted (so a batch of a
    scheduler or a backfill decides each of its runs as if the ones before it were inserted)."""

    def __init__(self, workflows: Iterable):
        limited = sorted({w.pk for w in workflows if w is not None and w.max_active_runs})
        self.rooms: dict[int, _Room] = {}
        if not limited:
            return
        with connection.cursor() as cursor:
            _lock(cursor, limited)
            cursor.execute(ROOM, [limited])
            for workflow_id, cap, running, waiting_live, waiting in cursor.fetchall():
                self.rooms[workflow_id] = _Room(cap, running, waiting_live, waiting)

    def admit(self, workflow, lane: int = Lane.LIVE) -> Admission:
        """Whether a new run of ``workflow`` in ``lane`` starts now (it then counts as running) or
        waits (it then waits in its lane, after those waiting already)."""
        room = self.rooms.get(workflow.pk) if workflow is not None else None
        if room is None:
            return START
        ahead = room.ahead(lane)
        if room.running + ahead < room.cap:
            room.running += 1
            return START
        room.waiting += 1
        if lane == Lane.LIVE:
            room.waiting_live += 1
        if room.running < room.cap:
            return Admission(RunState.PENDING, f"waiting behind earlier runs of the workflow for its "
                                               f"max_active_runs ({room.cap})")
        return Admission(RunState.PENDING, f"waiting: the workflow's max_active_runs ({room.cap}) is reached")


def admit_one(workflow, lane: int = Lane.LIVE) -> Admission:
    """The admission of one new run (in the caller's transaction)."""
    return Door([workflow]).admit(workflow, lane)


def releasable(limit: int = 500) -> list[int]:
    """The waiting runs that may start now, in the order they should (call it in the transaction
    that starts them): the rule above, applied to runs that already exist."""
    with connection.cursor() as cursor:
        cursor.execute(WAITING_WORKFLOWS)
        caps = dict(cursor.fetchall())
        if not caps:
            return []
        limited = sorted(pk for pk, cap in caps.items() if cap is not None)
        _lock(cursor, limited)
        running = {}
        if limited:
            cursor.execute(RUNNING_OF, [limited])
            running = dict(cursor.fetchall())
        room = {pk: limit if cap is None else max(0, cap - running.get(pk, 0)) for pk, cap in caps.items()}
        room = {pk: n for pk, n in room.items() if n > 0}
        if not room:
            return []
        cursor.execute(RELEASABLE, {"workflows": list(room), "room": list(room.values()), "limit": limit})
        return [row[0] for row in cursor.fetchall()]
