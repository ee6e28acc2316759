"""The worker's row and what it owns: registration, the heartbeat (which also reads the code
generation), the row's state, and which of the attempts it runs are still its own."""

from __future__ import annotations

import logging
import os

from django.db import connection

from orchestrator import reload
from orchestrator.states import LIVE_WORKER_STATES, TaskState, WorkerState, sql_list

log = logging.getLogger(__name__)

# --- SQL ---------------------------------------------------------------------------------------

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
        worker_id, generation = cursor.fetchone()
    return worker_id, generation


def beat(worker_id: int) -> int:
    """Send the heartbeat; returns the code generation now. A worker the reaper declared lost
    (a long pause) runs again from now."""
    with connection.cursor() as cursor:
        cursor.execute(HEARTBEAT, [worker_id])
        row = cursor.fetchone()
        if row is None:
            # Declared lost (a long pause): the reaper already gave these attempts to others.
            log.warning("this worker was declared lost; abandoning its running tasks",
                        extra={"action": "worker_revived"})
            cursor.execute(REVIVE, [worker_id])
            cursor.execute(f"SELECT {reload.CURRENT}")
            row = (None, cursor.fetchone()[0])
    return row[1]


def set_state(worker_id: int, state: WorkerState, *, stopped: bool = False) -> None:
    with connection.cursor() as cursor:
        cursor.execute(SET_STATE, [state, stopped, worker_id])


def still_mine(worker_id: int, messages: list[dict]) -> set[int]:
    """The ids of the task runs of these messages whose attempts are still this worker's."""
    with connection.cursor() as cursor:
        cursor.execute(STILL_MINE, {"ids": [m["id"] for m in messages], "numbers": [m["number"] for m in messages],
                                    "worker": worker_id})
        return {row[0] for row in cursor.fetchall()}
