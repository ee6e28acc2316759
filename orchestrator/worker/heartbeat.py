"""The worker's row and what it owns: registration, the heartbeat (which also reads the code
generation and the rings of the worker's queues, ``worker.wakeup``), the row's state, and which of
the attempts it runs are still its own. A worker that registers or changes state says so on the
fleet channel: the others read their rings again."""

from __future__ import annotations

import logging
import os

from django.db import connection

from orchestrator import reload
from orchestrator.channels import FLEET_CHANNEL
from orchestrator.conf import app_settings
from orchestrator.states import LIVE_WORKER_STATES, TaskState, WorkerState, sql_list
from orchestrator.worker.wakeup import FRESH_BEATS, RING, Ring, ring_by_channel

log = logging.getLogger(__package__)  # the worker's records under one name, orchestrator.worker

# --- SQL ---------------------------------------------------------------------------------------

REGISTER = f"""
WITH w AS (
    INSERT INTO orchestrator_worker (name, host, pid, queues, concurrency, state, started_at, heartbeat_at)
    VALUES (%s, %s, %s, %s, %s, '{WorkerState.RUNNING}', now(), now()) RETURNING id
)
SELECT id, {reload.CURRENT}, pg_notify('{FLEET_CHANNEL}', '') FROM w
"""

# The heartbeat, on the database clock. No row: the reaper declared this worker lost. It reads the
# code generation too (a worker that missed the NOTIFY of a sync notices it here) and the rings of
# the worker's queues, in the same round trip: a fleet's idle cost is its heartbeats, one
# transaction per worker per interval, not two. The rings are read in the statement's snapshot,
# where this worker's own heartbeat is the previous one: still fresh (FRESH_BEATS).
HEARTBEAT = f"""
WITH beat AS (
    UPDATE orchestrator_worker SET heartbeat_at = now()
    WHERE id = %(worker)s AND state IN ({sql_list(LIVE_WORKER_STATES)}) RETURNING state
), ring AS ({RING})
SELECT (SELECT state FROM beat) IS NOT NULL, {reload.CURRENT}, ring.* FROM ring
"""

# Declared lost by the reaper during a pause: running again from now.
REVIVE = f"""
UPDATE orchestrator_worker SET state = '{WorkerState.RUNNING}', heartbeat_at = now(), stopped_at = NULL
WHERE id = %s AND state = '{WorkerState.LOST}'
"""

SET_STATE = f"""
WITH w AS (UPDATE orchestrator_worker SET state = %s, stopped_at = CASE WHEN %s THEN now() END WHERE id = %s)
SELECT pg_notify('{FLEET_CHANNEL}', '')
"""

# Which of the task runs this worker is executing are still its own (not cancelled, not reaped).
STILL_MINE = f"""
SELECT t.id FROM orchestrator_taskrun t
JOIN unnest(%(ids)s::bigint[], %(numbers)s::int[]) AS u(id, number) ON t.id = u.id
WHERE (t.state = '{TaskState.RUNNING}' AND t.attempts = u.number AND t.worker_id = %(worker)s) IS TRUE
"""


def register(name: str, host: str, queues: list[str], concurrency: int) -> tuple[int, int]:
    """The new worker row: its id and the code generation now."""
    with connection.cursor() as cursor:
        cursor.execute(REGISTER, [name, host, os.getpid(), queues, concurrency])
        worker_id, generation, _ = cursor.fetchone()
    return worker_id, generation


def beat(worker_id: int, queues: list[str]) -> tuple[int, dict[str, Ring]]:
    """Send the heartbeat; returns the code generation now and the rings of ``queues``. A worker
    the reaper declared lost (a long pause) runs again from now."""
    with connection.cursor() as cursor:
        cursor.execute(HEARTBEAT, {"worker": worker_id, "queues": queues,
                                   "fresh": FRESH_BEATS * app_settings.HEARTBEAT_SECONDS})
        rows = cursor.fetchall()
        alive, generation = rows[0][:2]
        if not alive:
            # Declared lost (a long pause): the reaper already gave these attempts to others.
            log.warning("this worker was declared lost; abandoning its running tasks",
                        extra={"action": "worker_revived"})
            cursor.execute(REVIVE, [worker_id])
            cursor.execute(f"SELECT {reload.CURRENT}, pg_notify('{FLEET_CHANNEL}', '')")
            return cursor.fetchone()[0], {}
    return generation, ring_by_channel(row[2:] for row in rows)


def set_state(worker_id: int, state: WorkerState, *, stopped: bool = False) -> None:
    with connection.cursor() as cursor:
        cursor.execute(SET_STATE, [state, stopped, worker_id])


def still_mine(worker_id: int, messages: list[dict]) -> set[int]:
    """The ids of the task runs of these messages whose attempts are still this worker's."""
    with connection.cursor() as cursor:
        cursor.execute(STILL_MINE, {"ids": [m["id"] for m in messages], "numbers": [m["number"] for m in messages],
                                    "worker": worker_id})
        return {row[0] for row in cursor.fetchall()}
