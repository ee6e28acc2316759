"""What a claimed task run is given besides its spec: its run's logical date, params and workflow,
its parents' results, a mapped instance's item, and a data-triggered run's dataset events.

Filled into the claim messages in the claiming transaction, one set-based read per batch (two
for data-triggered runs; never one per task run), by the worker and by the local runner (``wf.test``) alike; a task
function receives it as its ``TaskContext``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orchestrator import db, secrets


@dataclass
class TaskContext:
    """What a task function receives as its only argument."""

    run_id: int
    task: str
    logical_date: datetime
    params: dict
    attempt: int
    # parent task name -> its JSON result; a mapped instance has its item under the mapped-over
    # parent's name (a mapped parent's result is the list of its instances' results).
    upstream: dict = field(default_factory=dict)
    workflow: str = ""
    task_run_id: int = 0
    # A mapped task's instance: its position in the parent's list and the item itself.
    map_index: int | None = None
    item: Any = None
    # The dataset events that started this run (data-triggered runs), oldest first: each a dict
    # with dataset, logical_date, metadata, workflow, run_id and task of the producer.
    events: list = field(default_factory=list)
    # Metadata for the events this task produces: ``ctx.metadata["sales_daily"] = {"rows": 10}``.
    metadata: dict = field(default_factory=dict)

    def secret(self, name: str) -> str:
        """The value of a secret the task (or its workflow) declares with ``secrets=[...]``;
        masked as ``***`` in everything the attempt stores (see orchestrator.secrets)."""
        return secrets.secret(name)

    def connection(self, name: str) -> secrets.Connection:
        """A connection the task (or its workflow) declares with ``connections=[...]``: ``.url``,
        ``.host``, ``.port``, ``.login``, ``.password``, ``.database``, ``.extra``."""
        return secrets.connection(name)


# --- SQL ---------------------------------------------------------------------------------------

# What each claimed workflow task is given, in one statement (one round trip of the claiming
# transaction, read before the batch's endings take their runs' locks to settle a map): its run's
# logical date, params and workflow, and one row per parent with the parent's result. A mapped parent
# counts by its own row (map_index -1), whose result is the list of its instances' results. A
# mapped instance is given its own item (stored in its row by mapping.EXPAND) under the
# mapped-over parent's name, never that parent's list: the CASE does not evaluate (nor read out of
# line) the list's value then. Instances created before items were stored have none (SQL NULL; an
# item null is JSON null) and read their element of the list, only then. Each parent is found by
# its whole key (run, task, -1), from the claimed rows: no plan reads the run's other task runs (a
# mapped run has one per instance). The params travel as text, parsed once per run.
CONTEXT = db.prepared("""
SELECT c.id, c.run_id, r.logical_date, r.params::text, COALESCE(w.name, ''), r.trigger, c.map_index,
       x.task, x.item, x.value
FROM orchestrator_taskrun c
JOIN orchestrator_run r ON r.id = c.run_id
LEFT JOIN orchestrator_workflow w ON w.id = r.workflow_id
LEFT JOIN LATERAL (
    SELECT u.task, u.task = c.spec->>'map_over' AND c.map_index >= 0 AS item,
           CASE WHEN u.task = c.spec->>'map_over' AND c.map_index >= 0 THEN COALESCE(c.item, p.result -> c.map_index)
                ELSE p.result END AS value
    FROM unnest(c.upstream) AS u(task)
    JOIN orchestrator_taskrun p ON p.run_id = c.run_id AND p.task = u.task AND p.map_index = -1
) x ON true
WHERE c.id = ANY (%(ids)s)
""")


def _json(value):
    return json.loads(value) if isinstance(value, str) else value


def _context(ids: list[int]) -> tuple[dict[int, tuple], dict[int, dict], dict[int, tuple[int, object]]]:
    """Each run's (logical date, params, workflow, trigger), the parents' results of these task
    runs, and each mapped instance's (map index, item). A prepared statement: a claim of workflow
    tasks sends it with every batch, and its plan took longer to make than to run."""
    runs: dict[int, tuple] = {}
    upstream: dict[int, dict] = {}
    items: dict[int, tuple[int, object]] = {}
    with db.cursor() as cursor:
        db.execute(cursor, CONTEXT, {"ids": ids})
        rows = cursor.fetchall()
    for child, run_id, logical_date, params, workflow, trigger, map_index, parent, is_item, value in rows:
        if run_id not in runs:
            runs[run_id] = (logical_date, _json(params) or {}, workflow, trigger)
        if parent is None:
            continue
        upstream.setdefault(child, {})[parent] = value = _json(value)
        if is_item:
            items[child] = (map_index, value)
    return runs, upstream, items


def _events(context: dict) -> dict:
    """The dataset events that started the runs (of ``context``) a data trigger started."""
    data_runs = [run_id for run_id, row in context.items() if row[3] == "dataset"]
    if not data_runs:
        return {}
    from orchestrator.datasets import events_of_runs  # noqa: PLC0415 - datasets needs the models; the DSL imports this module before the app registry is ready

    return events_of_runs(data_runs)


def fill(messages: list[dict]) -> None:
    """Add logical_date, params, workflow, upstream and, where they apply, map_index, item and
    events to the messages of workflow tasks (jobs need none of it). A message needs id, run_id
    and spec."""
    tasks = [m for m in messages if m["spec"].get("call") != "job"]
    if not tasks:
        return
    context, upstream, items = _context([m["id"] for m in tasks])
    events = _events(context)
    for m in tasks:
        logical_date, params, workflow, _ = context[m["run_id"]]
        m.update(logical_date=logical_date, params=params, workflow=workflow, upstream=upstream.get(m["id"], {}))
        if m["id"] in items:
            m["map_index"], m["item"] = items[m["id"]]
        if m["run_id"] in events:
            m["events"] = events[m["run_id"]]
