"""Run deadlines and run timeouts, checked by the scheduler's leader on every tick.

* **Deadline** (``Workflow(deadline=seconds)``): a run should have ended by its logical date plus
  the deadline (``Run.deadline_at``, set when the run is created; backfills have none). A run
  still active then is recorded as late (``deadline_missed_at``), the workflow's webhooks get
  the event ``deadline_missed``, and the dashboard lists it; the run goes on. A run that ends
  late between two checks is recorded when it ends (``finished_late``).
* **Run timeout** (``Workflow(run_timeout=seconds)``): a run still active that long after it
  started (``Run.timeout_at``) ends ``failed`` with the reason (as Airflow's dagrun_timeout
  does): its unfinished tasks are cancelled and the running ones killed, like an operator's
  cancel. The workflow's webhooks and notifications hear of a failed run, its ``on_failure``
  callbacks of ``timed_out``. The query (``TIMED_OUT``) is here; the ending is
  ``control.cancel_timed_out``, with the cancels.

Both reads use partial indexes on active runs, so finished history costs nothing.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import connection

from orchestrator import notifier
from orchestrator.states import ACTIVE_RUN_STATES, sql_list

log = logging.getLogger(__name__)

# --- SQL ---------------------------------------------------------------------------------------

# Active runs past their deadline, recorded once: the guard (deadline_missed_at IS NULL) lets
# a second scheduler's identical update change nothing, so each miss is announced once.
RECORD_MISSES = f"""
UPDATE orchestrator_run SET deadline_missed_at = %(now)s
WHERE id IN (SELECT id FROM orchestrator_run
             WHERE state IN ({sql_list(ACTIVE_RUN_STATES)}) AND deadline_missed_at IS NULL AND deadline_at <= %(now)s
             ORDER BY deadline_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
  AND deadline_missed_at IS NULL
RETURNING id
"""

# Runs that just ended after their deadline (called where runs end, in that transaction).
FINISHED_LATE = """
UPDATE orchestrator_run SET deadline_missed_at = finished_at
WHERE id = ANY (%(runs)s) AND deadline_missed_at IS NULL AND deadline_at < finished_at
RETURNING id
"""

# Active runs past their timeout, oldest first.
TIMED_OUT = f"""
SELECT r.id, EXTRACT(EPOCH FROM r.timeout_at - COALESCE(r.started_at, r.created_at)), r.timeout_at
FROM orchestrator_run r
WHERE r.state IN ({sql_list(ACTIVE_RUN_STATES)}) AND r.timeout_at <= %(now)s
ORDER BY r.timeout_at LIMIT %(limit)s
"""


def record_misses(now: datetime, limit: int = 500) -> int:
    """Record the runs that are past their deadline and still active; returns how many."""
    with connection.cursor() as cursor:
        cursor.execute(RECORD_MISSES, {"now": now, "limit": limit})
        missed = [row[0] for row in cursor.fetchall()]
    if missed:
        _announce(missed, now)
        log.warning("%d run(s) missed their deadline: %s", len(missed), ", ".join(map(str, missed)),
                    extra={"action": "deadline_missed"})
    return len(missed)


def finished_late(run_ids, now: datetime | None = None) -> int:
    """Record a miss for runs that just ended after their deadline (in the ending transaction)."""
    run_ids = sorted(set(run_ids))
    if not run_ids:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(FINISHED_LATE, {"runs": run_ids})
        late = [row[0] for row in cursor.fetchall()]
    if late:
        _announce(late, now)
    return len(late)


def _announce(run_ids: list[int], now: datetime | None) -> None:

    notifier.deadline_missed(run_ids, now=now)
