"""Callbacks: ``on_failure``, ``on_success`` and ``on_retry`` of a task, ``on_failure`` and
``on_success`` of a workflow's runs (and ``on_retry`` of a workflow, for all its tasks).

A callback is not called where the event happens (a worker's completion batch, the reaper, the
scheduler): it becomes a job, inserted in the same transaction as the state change that
triggers it, so it is never lost, retries like any job, runs on the workers and
shows in the UI. The event is recorded once because the transitions are guarded; like every job,
a callback runs at least once, retried by ``retries.CALLBACKS``.

A callback receives one argument, a dict:

    {"event": "on_failure", "workflow": "nightly_etl", "run_id": 12, "logical_date": "2026-…",
     "task": "load", "task_run_id": 345, "map_index": null, "attempt": 3, "state": "dead",
     "error": "ValueError: …"}

(``task``, ``task_run_id``, ``map_index`` and ``attempt`` are null for a run's callbacks;
``state`` is the new state: ``dead``, ``succeeded``, ``scheduled`` for a retry, or the run's
``failed``/``succeeded``/``timed_out``.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from django.db import connection

from orchestrator import clock, jobs, retries
from orchestrator.models import Run
from orchestrator.runs import NewRun, insert_runs
from orchestrator.states import Trigger

# Which callbacks a task run's new state calls, and which a run's end calls.
TASK_EVENTS = {"succeeded": "on_success", "dead": "on_failure", "scheduled": "on_retry"}
RUN_EVENTS = {"succeeded": "on_success", "failed": "on_failure", "timed_out": "on_failure"}

# --- SQL ---------------------------------------------------------------------------------------

# What a task's callbacks need to know, for the task runs that declare any. Both reads return
# the same columns: the key, its callbacks, then the context (task, task run, map index, attempt,
# error, run, logical date, workflow).
TASK_CONTEXT = """
SELECT t.id, t.spec->'callbacks', t.task, t.id, NULLIF(t.map_index, -1), t.attempts, t.error,
       r.id, r.logical_date, COALESCE(w.name, '')
FROM orchestrator_taskrun t
JOIN orchestrator_run r ON r.id = t.run_id
LEFT JOIN orchestrator_workflow w ON w.id = r.workflow_id
WHERE t.id = ANY (%(ids)s) AND t.spec ? 'callbacks'
"""

# The same for runs, from the graph version each ran.
RUN_CONTEXT = """
SELECT r.id, v.spec->'callbacks', NULL, NULL, NULL, NULL, r.reason, r.id, r.logical_date, w.name
FROM orchestrator_run r
JOIN orchestrator_workflow w ON w.id = r.workflow_id
JOIN orchestrator_workflowversion v ON v.id = r.version_id
WHERE r.id = ANY (%(ids)s) AND v.spec ? 'callbacks'
"""


def _json(value):
    return json.loads(value) if isinstance(value, str) else (value or {})


def _enqueue_for(sql: str, states: dict, events: dict, now) -> int:
    """One job per callback the new states call: ``states`` maps a task run (or run) id to its new
    state, ``events`` a state to the callback it calls."""
    states = {key: state for key, state in states.items() if state in events}
    if not states:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(sql, {"ids": list(states)})
        rows = cursor.fetchall()
    calls = []
    for key, callbacks, task, task_run_id, map_index, attempt, error, run_id, logical_date, workflow in rows:
        event = events[states[key]]
        for ref in _json(callbacks).get(event, []):
            calls.append((ref, {
                "event": event, "workflow": workflow, "run_id": run_id, "logical_date": logical_date.isoformat(),
                "task": task, "task_run_id": task_run_id, "map_index": map_index, "attempt": attempt,
                "state": states[key], "error": error,
            }))
    return enqueue_calls(calls, now)


def task_ended(changes: Iterable[tuple[int, str]], now=None) -> int:
    """Enqueue the callbacks of task runs that reached a new state ((task_run_id, state)
    pairs: succeeded, dead, or scheduled for a retry); returns how many jobs were made."""
    return _enqueue_for(TASK_CONTEXT, dict(changes), TASK_EVENTS, now)


def run_ended(finished: Iterable[tuple[int, str]], now=None) -> int:
    """Enqueue the callbacks of runs that ended ((run_id, state) pairs)."""
    return _enqueue_for(RUN_CONTEXT, dict(finished), RUN_EVENTS, now)


def job_spec(ref: str, context: dict) -> dict:
    """The spec of a callback's job, made with the checks of ``jobs.enqueue`` but the reference's:
    that one comes from a definition (checked by sync, or a function ``wf.test()`` holds), and a
    worker runs it only if a stored graph version declares it."""
    return jobs.job_spec(ref, args=[context], retry=retries.CALLBACKS, spec_extra={"callback": context["event"]})


def enqueue_calls(calls: list[tuple[str, dict]], now=None) -> int:
    """Insert one job per call in the current transaction, through the door of every run
    (``runs.insert_runs``: one INSERT and one COPY whatever the count)."""
    if not calls:
        return 0
    now = now or clock.now()
    insert_runs([NewRun(Run(workflow=None, logical_date=now, trigger=Trigger.JOB), {ref: job_spec(ref, context)}, now)
                 for ref, context in calls], now)
    return len(calls)
