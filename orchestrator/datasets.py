"""Workflows started by data: a task that ``produces=["sales_daily"]`` writes a dataset event
when it succeeds, and each workflow with ``triggers=[On("sales_daily")]`` gets exactly one run
for it.

Two steps, each guarded by a constraint rather than by coordination between processes:

1. ``record_events`` runs in the transaction that records the producer's success (the worker's
   completion batch): one event per (dataset, producing task run), ``ON CONFLICT DO NOTHING``,
   so a producer that succeeds again after a retry or a clear announces nothing new.
2. ``trigger_consumers`` runs in the scheduler's tick (the leader's, fenced by its lease): it
   turns each new event into one pending ``ConsumerRun`` row per consumer, ``UNIQUE (event,
   workflow)`` with ``ON CONFLICT DO NOTHING``, then starts runs for the pending rows: one per
   row for a trigger in mode "any"; for mode "all", one run taking every pending row of the
   trigger once each of its datasets has one. The rows a run takes are locked and marked with a
   guarded update (``consumed_at IS NULL``), so two schedulers that both believe they lead
   cannot start a consumer twice for one event.

A consumer run's logical date is its (latest) event's; the events, with their metadata, are in
the task context as ``ctx.events``.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

from django.db import connection, transaction

from orchestrator.channels import wake_schedulers
from orchestrator.models import Dataset, DatasetEvent, Workflow
from orchestrator.params import ParamError, clean_params
from orchestrator.runs import create_run
from orchestrator.states import RunState, TaskState, Trigger

log = logging.getLogger(__name__)

# --- SQL ---------------------------------------------------------------------------------------

# The datasets named by succeeded producers, created on first use.
ENSURE_DATASETS = f"""
INSERT INTO orchestrator_dataset (name, created_at)
SELECT DISTINCT jsonb_array_elements_text(t.spec->'produces'), %(now)s
FROM orchestrator_taskrun t
WHERE t.id = ANY (%(ids)s) AND t.state = '{TaskState.SUCCEEDED}' AND t.spec ? 'produces'
ON CONFLICT (name) DO NOTHING
"""

# One event per dataset a succeeded producer declares. UNIQUE (dataset, task_run): the same task
# run succeeding again (cleared, retried from the dead-letter queue after a mark) adds nothing.
# The metadata comes from the task (ctx.metadata[dataset]), when it gave any.
INSERT_EVENTS = f"""
INSERT INTO orchestrator_datasetevent
    (dataset_id, task_run_id, run_id, workflow, task, logical_date, metadata, created_at, handled)
SELECT d.id, t.id, t.run_id, COALESCE(w.name, ''), t.task, r.logical_date,
       COALESCE(m.metadata::jsonb -> d.name, '{{}}'::jsonb), %(now)s, false
FROM orchestrator_taskrun t
JOIN orchestrator_run r ON r.id = t.run_id
LEFT JOIN orchestrator_workflow w ON w.id = r.workflow_id
CROSS JOIN LATERAL jsonb_array_elements_text(t.spec->'produces') AS p(name)
JOIN orchestrator_dataset d ON d.name = p.name
LEFT JOIN unnest(%(meta_ids)s::bigint[], %(metas)s::text[]) AS m(id, metadata) ON m.id = t.id
WHERE t.id = ANY (%(ids)s) AND t.state = '{TaskState.SUCCEEDED}' AND t.spec ? 'produces'
ORDER BY t.id, d.name
ON CONFLICT (dataset_id, task_run_id) DO NOTHING
RETURNING id
"""

# New events, oldest first; a second scheduler skips what the first is handling.
UNHANDLED = """
SELECT e.id, d.name FROM orchestrator_datasetevent e JOIN orchestrator_dataset d ON d.id = e.dataset_id
WHERE NOT e.handled ORDER BY e.id LIMIT %(limit)s
FOR UPDATE OF e SKIP LOCKED
"""

# The workflows that consume data: (id, its triggers) from their current version.
CONSUMERS = """
SELECT w.id, v.spec->'triggers' FROM orchestrator_workflow w
JOIN orchestrator_workflowversion v ON v.id = w.current_version_id
WHERE w.present AND v.spec ? 'triggers'
"""

# One pending row per (event, consumer). The unique constraint makes a second insert (another
# scheduler, a replayed tick) a no-op.
INSERT_PENDING = """
INSERT INTO orchestrator_consumerrun (event_id, workflow_id, created_at)
SELECT * FROM unnest(%(events)s::bigint[], %(workflows)s::bigint[], %(nows)s::timestamptz[])
ON CONFLICT (event_id, workflow_id) DO NOTHING
"""

# An event is handled once its consumers have their pending rows; the guard makes a second
# scheduler handling the same events a no-op.
MARK_HANDLED = "UPDATE orchestrator_datasetevent SET handled = true WHERE id = ANY (%(ids)s) AND NOT handled"

# Pending rows of the consumers that may start runs now (not paused, still defined, with a valid
# version), per consumer and dataset, oldest first. Read without locks: each run's rows are then
# locked (LOCK_ROWS) and taken with a guarded update (CONSUME).
PENDING = """
SELECT c.workflow_id, d.name, array_agg(c.id ORDER BY c.id), array_agg(e.logical_date ORDER BY c.id)
FROM orchestrator_consumerrun c
JOIN orchestrator_datasetevent e ON e.id = c.event_id
JOIN orchestrator_dataset d ON d.id = e.dataset_id
JOIN orchestrator_workflow w ON w.id = c.workflow_id
WHERE c.consumed_at IS NULL AND NOT w.paused AND w.present AND w.current_version_id IS NOT NULL
GROUP BY c.workflow_id, d.name
"""

# The rows one run would take, locked; rows another scheduler holds are skipped (the run is then
# left to the next tick), and a row consumed meanwhile fails the re-checked condition.
LOCK_ROWS = """
SELECT id FROM orchestrator_consumerrun WHERE id = ANY (%(ids)s) AND consumed_at IS NULL
FOR UPDATE SKIP LOCKED
"""

# The guard: rows are taken by one run only. Row count checked against the rows meant.
CONSUME = """
UPDATE orchestrator_consumerrun SET run_id = %(run)s, consumed_at = %(now)s
WHERE id = ANY (%(ids)s) AND consumed_at IS NULL
"""

# What a data-triggered run's tasks see as ctx.events.
EVENTS_OF_RUNS = """
SELECT c.run_id, d.name, e.logical_date, e.metadata, e.workflow, e.run_id, e.task, e.id
FROM orchestrator_consumerrun c
JOIN orchestrator_datasetevent e ON e.id = c.event_id
JOIN orchestrator_dataset d ON d.id = e.dataset_id
WHERE c.run_id = ANY (%(runs)s)
ORDER BY c.run_id, e.id
"""


# --- producing -----------------------------------------------------------------------------------

def record_events(succeeded: Sequence[int], metadata: dict[int, str] | None = None, *,
                  now: datetime) -> int:
    """Write the dataset events of these succeeded task runs (those whose spec ``produces``),
    in the caller's transaction; ``metadata`` maps a task run id to the JSON text of its
    ``ctx.metadata``. Returns how many events were new; wakes the schedulers at commit."""
    if not succeeded:
        return 0
    ids = sorted(set(succeeded))
    metadata = metadata or {}
    with connection.cursor() as cursor:
        cursor.execute(ENSURE_DATASETS, {"ids": ids, "now": now})
        cursor.execute(INSERT_EVENTS, {"ids": ids, "now": now, "meta_ids": list(metadata),
                                       "metas": list(metadata.values())})
        created = len(cursor.fetchall())
        if created:
            wake_schedulers()
    return created


def record_by_hand(name: str, metadata: dict, *, now: datetime) -> DatasetEvent:
    """An event of dataset ``name`` recorded by an operator (the web page or the API; the caller
    writes the audit record): no producing task run, the logical date ``now``. Its consumers are
    started by the scheduler as for any event; it is woken at commit."""
    with transaction.atomic():
        dataset, _ = Dataset.objects.get_or_create(name=name)
        event = DatasetEvent.objects.create(dataset=dataset, workflow="", task="", logical_date=now,
                                            metadata=metadata, created_at=now, handled=False)
        wake_schedulers()
    return event


# --- consuming -----------------------------------------------------------------------------------

def _consumers(cursor) -> dict[int, list[dict]]:
    cursor.execute(CONSUMERS)
    return {workflow_id: json.loads(triggers) if isinstance(triggers, str) else triggers
            for workflow_id, triggers in cursor.fetchall()}


def record_pending(now: datetime, limit: int = 500) -> int:
    """Step 2a: a pending row per (new event, consumer). Returns how many events were handled."""
    with connection.cursor() as cursor:
        cursor.execute(UNHANDLED, {"limit": limit})
        events = cursor.fetchall()
        if not events:
            return 0
        by_dataset: dict[str, list[int]] = defaultdict(list)
        for workflow_id, triggers in _consumers(cursor).items():
            for trigger in triggers:
                for dataset in trigger.get("datasets", []):
                    by_dataset[dataset].append(workflow_id)
        rows = [(event_id, workflow_id) for event_id, dataset in events for workflow_id in by_dataset.get(dataset, [])]
        if rows:
            cursor.execute(INSERT_PENDING, {"events": [e for e, _ in rows], "workflows": [w for _, w in rows],
                                            "nows": [now] * len(rows)})
        cursor.execute(MARK_HANDLED, {"ids": [event_id for event_id, _ in events]})
    return len(events)


def _plans(pending: list[tuple], consumers: dict[int, list[dict]], limit: int) -> list[tuple[int, list[int], datetime]]:
    """Which runs the pending rows start: [(workflow_id, row ids, logical date)], at most
    ``limit`` of them."""
    plans = []
    by_trigger: dict[tuple[int, int], dict[str, list[tuple[int, datetime]]]] = defaultdict(dict)
    for workflow_id, dataset, ids, dates in pending:
        for index, trigger in enumerate(consumers.get(workflow_id, [])):
            if dataset in trigger.get("datasets", []):
                by_trigger[(workflow_id, index)][dataset] = list(zip(ids, dates, strict=True))
                break
    for (workflow_id, index), rows in sorted(by_trigger.items()):
        trigger = consumers[workflow_id][index]
        if trigger.get("mode", "any") == "all":
            # Once each dataset has an event since the last run: one run takes them all.
            if set(trigger["datasets"]) <= set(rows):
                taken = sorted(row for dataset_rows in rows.values() for row in dataset_rows)
                plans.append((workflow_id, [row_id for row_id, _ in taken], max(at for _, at in taken)))
        else:
            plans.extend((workflow_id, [row_id], at) for dataset_rows in rows.values() for row_id, at in dataset_rows)
    plans.sort(key=lambda plan: min(plan[1]))  # oldest events first
    return plans[:limit]


class _Taken(Exception):
    """The rows of a planned run were taken by another scheduler meanwhile."""


def start_consumers(now: datetime, limit: int = 500) -> int:
    """Step 2b: start the runs the pending rows call for; returns how many were started."""
    with connection.cursor() as cursor:
        cursor.execute(PENDING)
        pending = cursor.fetchall()
        if not pending:
            return 0
        plans = _plans(pending, _consumers(cursor), limit)
    workflows = {w.pk: w for w in Workflow.objects.filter(pk__in={p[0] for p in plans})
                 .select_related("current_version")}
    started = 0
    for workflow_id, row_ids, logical_date in plans:
        try:
            with transaction.atomic():
                run = _start(workflows[workflow_id], row_ids, logical_date, now)
        except _Taken:
            continue
        started += 1
        log.info("started run %s of %s from %d dataset event(s)", run.pk, run.workflow.name, len(row_ids),
                 extra={"action": "dataset_run", "run_id": run.pk, "workflow": run.workflow.name})
    return started


def _start(workflow, row_ids: list[int], logical_date: datetime, now: datetime):
    with connection.cursor() as cursor:
        cursor.execute(LOCK_ROWS, {"ids": row_ids})
        if len(cursor.fetchall()) != len(row_ids):
            raise _Taken
        state, reason = RunState.RUNNING, ""
        try:
            params = clean_params(workflow.current_version.spec.get("params", {}), {})
        except ParamError as exc:  # sync refuses this; a row edited by hand could still get here
            state, reason, params = RunState.SKIPPED, f"cannot start from data: {exc}", {}
        # Past the workflow's max_active_runs the run is held back (pending), not dropped: admission.
        run, _ = create_run(workflow, trigger=Trigger.DATASET, params=params, logical_date=logical_date,
                            state=state, reason=reason, now=now)
        cursor.execute(CONSUME, {"run": run.pk, "now": now, "ids": row_ids})
        if cursor.rowcount != len(row_ids):  # cannot happen while the rows are locked; never double
            raise _Taken
    return run


def trigger_consumers(now: datetime, limit: int = 500) -> int:
    """The scheduler's step for data triggers (call it in a fenced transaction): returns how
    many events were handled plus how many runs were started."""
    handled = record_pending(now, limit)
    return handled + start_consumers(now, limit)


def events_of_runs(run_ids: Sequence[int]) -> dict[int, list[dict]]:
    """ctx.events of data-triggered runs: {run_id: [event, ...]}, oldest first."""
    found: dict[int, list[dict]] = defaultdict(list)
    if not run_ids:
        return found
    with connection.cursor() as cursor:
        cursor.execute(EVENTS_OF_RUNS, {"runs": sorted(set(run_ids))})
        for run_id, dataset, logical_date, metadata, workflow, producer_run, task, event_id in cursor.fetchall():
            found[run_id].append({
                "id": event_id, "dataset": dataset, "logical_date": logical_date.isoformat(),
                "metadata": json.loads(metadata) if isinstance(metadata, str) else metadata,
                "workflow": workflow, "run_id": producer_run, "task": task,
            })
    return found
