"""Creating runs: every run and its task runs are inserted here, with the database deciding
duplicates (a unique constraint and ``ON CONFLICT DO NOTHING``, never a check beforehand), and
every run that is to start asks admission first (``admission.py``: ``max_active_runs``), so a
trigger, a schedule, a data event, a backfill, a callback and a job follow one rule.

* ``create_run``: one run (a manual or API trigger, a data event, a one-off job, a
  ``django.tasks`` task, a ``wf.test()``), in its own transaction, answering the existing run for a
  repeated idempotency key or logical date.
* ``insert_runs``: many runs in the caller's transaction (a scheduler batch, a backfill, the
  callbacks of a batch of outcomes), one INSERT per 2,000 runs and one COPY for their task runs.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import operator
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from psycopg import pq
from psycopg.types.json import Jsonb

from orchestrator import admission, clock, db, retries, tracing
from orchestrator.channels import DISPATCH_CHANNEL, MAX_TOKENS, WAKE_SEQUENCE, queue_channel, wake_due
from orchestrator.conf import app_settings
from orchestrator.limits import logical_date_error
from orchestrator.models import QueueLimit, Run, TaskRun, TenantLimit, Workflow, WorkflowVersion
from orchestrator.params import clean_params
from orchestrator.states import Lane, RunState, TaskState, Trigger

# Runs recorded as already over (a skipped or missed fire time, a run cancelled at once): no task runs.
FINISHED_AT_BIRTH = (RunState.SKIPPED, RunState.MISSED, RunState.CANCELLED)


class RunError(ValueError):
    """A run could not be created; ``field`` says which input was at fault."""

    def __init__(self, message: str, field: str = "non_field_errors"):
        self.field = field
        super().__init__(message)


class IdempotencyConflict(RunError):
    def __init__(self, key: str, existing: Run):
        self.existing = existing
        super().__init__(
            f"idempotency key {key!r} was already used for a different request (run {existing.pk})",
            field="idempotency_key",
        )


def payload_hash(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def apply_graph_options(run: Run, spec: dict, now: datetime) -> None:
    """Set what a new run takes from its graph (``spec``, a version's spec): its deadline
    (logical date + the workflow's ``deadline``), its timeout when it starts now (now +
    ``run_timeout``), and whether the resolver's mapping and branch steps apply. Backfills have no
    deadline: their logical dates are in the past by design."""
    run.dynamic = any(task.get("map_over") or task.get("branch") for task in spec.get("tasks", {}).values())
    if spec.get("deadline") and run.lane != Lane.BACKFILL and run.trigger != Trigger.BACKFILL:
        run.deadline_at = run.logical_date + timedelta(seconds=float(spec["deadline"]))
    if spec.get("run_timeout") and run.state == RunState.RUNNING:
        run.timeout_at = now + timedelta(seconds=float(spec["run_timeout"]))


def task_run_values(run: Run, tasks: dict[str, dict], due_at: datetime | None, hold: bool = False) -> list[dict]:
    """The values (by attribute) of a new run's task runs: roots due now (or at ``due_at``), the
    rest waiting for parents."""
    rows = []
    children: dict[str, list[str]] = {name: [] for name in tasks}
    for name, spec in tasks.items():
        for parent in spec.get("upstream", []):
            children.setdefault(parent, []).append(name)
    for name, spec in tasks.items():
        upstream = list(spec.get("upstream", []))
        root = not upstream
        rows.append({
            "task": name, "spec": spec, "upstream": upstream, "downstream": children[name],
            "state": TaskState.SCHEDULED if root and not hold else TaskState.WAITING,
            "due_at": due_at if root and not hold else None,
            "queue": spec.get("queue", "default"), "priority": run.priority + int(spec.get("priority", 0)),
            "tenant": run.tenant, "lane": run.lane, "max_attempts": retries.allowance(spec),
            "timeout": spec.get("timeout"),
        })
    return rows


def task_runs_for(run: Run, tasks: dict[str, dict], due_at: datetime | None, hold: bool = False) -> list[TaskRun]:
    """Task run rows of a new run: roots due now (or at ``due_at``), the rest waiting for parents."""
    return [TaskRun(run=run, **values) for values in task_run_values(run, tasks, due_at, hold)]


class _Columns:
    """A row's values by attribute, for ``_columns``: what a TaskRun instance would hold, without
    building one (a model instance cost as much per job as the rest of ``enqueue_many``)."""

    def __init__(self, values: dict):
        self.__dict__.update(values)


def _task_defaults() -> dict:
    """The attributes of a new TaskRun that ``task_run_values`` does not set (one dict per batch:
    the values are only sent, never changed)."""
    return {f.attname: f.get_default() for f in _task_fields()}


# --- Many runs at once: the scheduler's batches and backfills ----------------------------------


@dataclass
class NewRun:
    run: Run
    tasks: dict
    due_at: datetime | None = None
    admitted: bool = False  # the caller asked admission already (the scheduler, while planning)


RUN_CHUNK = 2000  # runs per INSERT statement


def insert_runs(new_runs: list[NewRun], now: datetime) -> list[NewRun]:
    """Insert many runs and the task runs of those that were new, in the caller's transaction.

    Runs: one ``INSERT … SELECT FROM unnest(<one array per column>) ON CONFLICT DO NOTHING
    RETURNING`` per chunk, so runs whose (schedule, logical_date) already exists are left out by the
    database, not by a check beforehand. Arrays per column rather than a multi-row VALUES list: a
    query with a handful of parameters instead of tens of thousands is parsed and sent far faster.
    Task runs of new runs cannot conflict, so they go in by COPY. A run to start (``running``) that
    the caller did not admit is admitted here, in order. Returns the entries that were created
    (their ``run.pk`` set)."""
    if not new_runs:
        return []
    _admit([entry for entry in new_runs if not entry.admitted and entry.run.state == RunState.RUNNING])
    created: list[NewRun] = []
    for start in range(0, len(new_runs), RUN_CHUNK):
        created += _insert_run_chunk(new_runs[start:start + RUN_CHUNK], now)
    task_rows = _task_rows_of(created, now)
    if task_rows:
        _copy(TaskRun, task_rows)
    wake_for(task_rows)
    return created


def _admit(entries: list[NewRun]) -> None:
    door = admission.Door(entry.run.workflow for entry in entries if entry.run.workflow_id)
    for entry in entries:
        if entry.run.workflow_id:
            decision = door.admit(entry.run.workflow, entry.run.lane)
            entry.run.state, entry.run.reason = decision.state, decision.reason
        entry.admitted = True


def _run_fields():
    return [f for f in Run._meta.concrete_fields if not f.primary_key]


def _insert_runs_sql(run_fields) -> str:
    qn = connection.ops.quote_name
    columns = ", ".join(qn(f.column) for f in run_fields)
    arrays = ", ".join(f"%s::{f.db_type(connection)}[]" for f in run_fields)
    return (f"INSERT INTO {qn(Run._meta.db_table)} ({columns}) SELECT * FROM unnest({arrays}) "
            f"ON CONFLICT DO NOTHING RETURNING id, schedule_id, logical_date")


def _insert_run_chunk(chunk: list[NewRun], now: datetime) -> list[NewRun]:
    """One INSERT for the chunk; the entries the database created, their primary keys set."""
    run_fields = _run_fields()
    by_key: dict[tuple, NewRun | None] = {}
    values: list[list] = [[] for _ in run_fields]
    for entry in chunk:
        run = entry.run
        if run.state in FINISHED_AT_BIRTH and run.finished_at is None:
            run.finished_at = now
        if run.version is not None:
            apply_graph_options(run, run.version.spec, now)
        for column, f in zip(values, run_fields, strict=True):
            column.append(f.get_db_prep_save(f.pre_save(run, add=True), connection))
        key = (run.schedule_id, run.logical_date)
        by_key[key] = None if key in by_key else entry  # None: the key is not unique in the chunk
    with connection.cursor() as cursor:
        cursor.execute(_insert_runs_sql(run_fields), values)
        rows = cursor.fetchall()
    if len(rows) == len(chunk):
        # Every row was new: the rows come back in the order they were given (as Django's own
        # bulk_create relies on), which tells apart runs of the same key (the callback jobs of one
        # batch have no schedule and one logical date).
        entries = chunk
    else:
        # Some already existed: only runs of a schedule can (the (schedule, logical date) unique
        # constraint), and their key tells which.
        entries = [by_key[(schedule_id, logical_date)] for _, schedule_id, logical_date in rows]
        if None in entries:
            raise RunError("runs without a unique (schedule, logical date) cannot be inserted in one batch "
                           "with runs that already exist")
    created = []
    for (pk, _, _), entry in zip(rows, entries, strict=True):
        entry.run.pk = pk
        entry.run._state.adding = False
        created.append(entry)
    return created


def _task_rows_of(created: list[NewRun], now: datetime) -> list[TaskRun]:
    """The task runs of the new runs that will run."""
    task_rows = []
    for entry in created:
        run = entry.run
        if run.state in (RunState.RUNNING, RunState.PENDING):
            tasks = tracing.new_run(entry.tasks)
            task_rows.extend(task_runs_for(run, tasks, entry.due_at or now, hold=run.state == RunState.PENDING))
            tracing.enqueued(run, tasks)
    return task_rows


def wake_for(task_rows: list[TaskRun]) -> None:
    """Wake the dispatchers and the workers of the queues that new scheduled task runs are in (a
    delayed one too: a worker then learns when it is due)."""
    queues = Counter(task_run.queue for task_run in task_rows if task_run.state == TaskState.SCHEDULED)
    if queues:
        wake_due(queues)


def _copy(model, objs) -> None:
    """COPY rows in (they cannot conflict): the fastest way PostgreSQL takes many rows."""
    if connection.connection.info.pipeline_status != pq.PipelineStatus.OFF:
        # COPY cannot run in pipeline mode (the callbacks of a worker's batch): INSERT there.
        model.objects.bulk_create(objs, batch_size=RUN_CHUNK)
        return
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    with connection.cursor() as cursor, cursor.copy(
            f"COPY {connection.ops.quote_name(model._meta.db_table)} ({columns}) FROM STDIN") as copy:
        for obj in objs:
            copy.write_row([f.get_db_prep_save(f.pre_save(obj, add=True), connection) for f in fields])


def create_run(
    workflow: Workflow | None,
    *,
    trigger: str,
    params: dict | None = None,
    logical_date: datetime | None = None,
    schedule=None,
    backfill=None,
    version: WorkflowVersion | None = None,
    tasks: dict[str, dict] | None = None,
    idempotency_key: str | None = None,
    request_payload: dict | None = None,
    priority: int = 0,
    lane: int = Lane.LIVE,
    due_at: datetime | None = None,
    state: str = RunState.RUNNING,
    reason: str = "",
    tenant: str | None = None,
    created_by=None,
    now: datetime | None = None,
) -> tuple[Run, bool]:
    """Insert a run and its task runs; returns (run, created).

    ``params`` must already be checked (``params.clean_params``). A run whose (schedule,
    logical_date) or idempotency key exists is not created again: the existing run is returned
    with created=False. An idempotency key reused with a different ``request_payload`` raises
    IdempotencyConflict. A run of a workflow to start (``state=RUNNING``, the default) is admitted
    first, and may be created PENDING (``admission.py``); ``state=PENDING`` holds every task back
    until the run is released; SKIPPED and MISSED runs are recorded without task runs.
    """
    now = now or clock.now()
    version, tasks = _graph(workflow, version, tasks)
    digest = payload_hash(request_payload) if request_payload is not None else ""
    run = Run(
        workflow=workflow, version=version, schedule=schedule, backfill=backfill,
        logical_date=logical_date or now, trigger=trigger, params=params or {},
        tenant=tenant or (workflow.tenant if workflow else "default"), priority=priority, lane=lane,
        state=state, reason=reason, idempotency_key=idempotency_key or None, payload_hash=digest,
        created_by=created_by,
    )
    if state in FINISHED_AT_BIRTH:
        run.finished_at = now
    tasks = tracing.new_run(tasks)
    run, created = _insert_run(run, version.spec if version is not None else {"tasks": tasks}, tasks, due_at or now, now)
    if created:
        tracing.enqueued(run, tasks)
    return run, created


# --- Runs and their task runs in one statement -------------------------------------------------


def insert_new_runs(entries: list[NewRun], now: datetime) -> list[NewRun]:
    """Insert runs and their task runs in ONE statement (``_insert_new_sql``); returns the entries
    the database created, their ``run.pk`` set. A run whose idempotency key or (schedule, logical
    date) exists is left out by the database (``ON CONFLICT DO NOTHING``), not by a check
    beforehand. The caller admitted the runs that need it. One statement is atomic by itself, so a
    job's ``create_run`` takes one round trip outside a transaction, and ``jobs.enqueue_many`` one
    statement for N jobs.

    Run ids are drawn from the run table's sequence inside the statement, so the task runs find
    their run's id without a second statement. The workers of the queues that received due work
    are woken by the same statement, and the dispatchers only where a concurrency limit applies to
    that work: the rest the workers claim directly, and waking every dispatcher for it would cost
    each of them a look for nothing.

    A column whose value is the same in every row (most of them, in a batch of jobs) is sent once,
    not as an array: Django's cursor formats every value into the text in Python, which for a batch
    of 500 jobs cost several times the database's own work."""
    if not entries:
        return []
    runs, task_runs, run_numbers = [], [], []
    defaults = _task_defaults()
    for number, entry in enumerate(entries, start=1):
        run = entry.run
        if run.state in FINISHED_AT_BIRTH and run.finished_at is None:
            run.finished_at = now
        runs.append(run)
        if run.state not in FINISHED_AT_BIRTH:
            for values in task_run_values(run, entry.tasks, entry.due_at or now, hold=run.state == RunState.PENDING):
                task_runs.append(_Columns({**defaults, **values}))
                run_numbers.append(number)
    params: dict = {"numbers": list(range(1, len(runs) + 1)), "run_numbers": run_numbers}
    run_shape = _columns("r", _run_fields(), runs, params)
    task_shape = _columns("t", _task_fields(), task_runs, params)
    queues = sorted({task_run.queue for task_run in task_runs})
    params.update({
        "queues": queues, "channels": [queue_channel(queue) for queue in queues],
        "every": app_settings.DEFAULT_QUEUE_LIMIT is not None or app_settings.DEFAULT_TENANT_LIMIT is not None,
    })
    # Prepared and bound on the server (``db.execute``): the statement is long, and Django's cursor
    # would parse its text and format every value into it in Python at each enqueue, which cost
    # a job's producer more than the database's work for it.
    with connection.wrap_database_errors, db.cursor() as cursor:
        db.execute(cursor, _insert_new_sql(run_shape, task_shape), params)
        rows = cursor.fetchall()
    created = []
    for number, pk in rows:
        if number is None:
            continue
        entry = entries[number - 1]
        entry.run.pk = pk
        entry.run._state.adding = False
        created.append(entry)
    return created


def _columns(prefix: str, fields, objs, params: dict) -> tuple[bool, ...]:
    """Each column's parameter (``params[prefix + i]``): one value when every row has the same, an
    array otherwise; returns which columns are arrays (the statement's shape)."""
    shape = []
    wrapper = connections[DEFAULT_DB_ALIAS]  # once, not through the proxy for every value
    for i, f in enumerate(fields):
        if objs and (getattr(f, "auto_now_add", False) or getattr(f, "auto_now", False)):
            moment = f.pre_save(objs[0], add=True)  # created_at: one statement, one moment
            for obj in objs:
                setattr(obj, f.attname, moment)
            values = [moment]
        else:
            values = list(map(operator.attrgetter(f.attname), objs))  # the loop in C
        first = values[0] if values else None
        # In C, not one Python comparison per value: equal to the first, and of one type (1 and True
        # are equal, but not the same value to send).
        varies = values.count(first) != len(values) or len(set(map(type, values))) > 1
        if f.name in ARRAY_COLUMNS:  # an array column travels as JSON: an array of arrays must be rectangular
            prep = Jsonb
        else:
            def prep(value, f=f):
                return f.get_db_prep_save(value, wrapper)
        params[f"{prefix}{i}"] = [prep(value) for value in values] if varies else prep(first)
        shape.append(varies)
    return tuple(shape)


ARRAY_COLUMNS = ("upstream", "downstream")  # a task run's parents and children by name


def _task_fields():
    return [f for f in TaskRun._meta.concrete_fields if not f.primary_key and f.name != "run"]


@functools.lru_cache(maxsize=64)  # one text per shape (which columns vary): a handful in practice
def _insert_new_sql(run_shape: tuple[bool, ...], task_shape: tuple[bool, ...]) -> db.Prepared:
    qn = connection.ops.quote_name
    run_fields, task_fields = _run_fields(), _task_fields()

    def typed(f, array: bool) -> str:
        return f"{'jsonb' if f.name in ARRAY_COLUMNS else f.db_type(connection)}{'[]' if array else ''}"

    def value(prefix: str, i: int, f, varies: bool) -> str:
        expression = f"u.{prefix}{i}" if varies else f"%({prefix}{i})s::{typed(f, False)}"
        if f.name in ARRAY_COLUMNS:
            return f"ARRAY(SELECT jsonb_array_elements_text({expression}))::{f.db_type(connection)}"
        return expression

    def unnest(prefix: str, fields, shape, numbers: str) -> str:
        arrays = [f"%({numbers})s::int[]"] + [f"%({prefix}{i})s::{typed(f, True)}"
                                             for i, (f, varies) in enumerate(zip(fields, shape, strict=True)) if varies]
        names = ["number"] + [f"{prefix}{i}" for i, varies in enumerate(shape) if varies]
        return f"unnest({', '.join(arrays)}) AS u({', '.join(names)})"

    run_values = ", ".join(value("r", i, f, varies).replace("u.r", "input.r")
                           for i, (f, varies) in enumerate(zip(run_fields, run_shape, strict=True)))
    task_values = ", ".join(value("t", i, f, varies) for i, (f, varies) in enumerate(zip(task_fields, task_shape, strict=True)))
    scheduled = f"'{TaskState.SCHEDULED}'"
    return db.prepared(f"""
WITH input AS MATERIALIZED (
    -- Each run's id, drawn here so that its task runs can name it in the same statement.
    SELECT nextval(pg_get_serial_sequence('{Run._meta.db_table}', 'id')) AS id, u.*
    FROM {unnest("r", run_fields, run_shape, "numbers")}
), r AS (
    INSERT INTO {qn(Run._meta.db_table)} (id, {", ".join(qn(f.column) for f in run_fields)})
    SELECT input.id, {run_values} FROM input ORDER BY input.number
    ON CONFLICT DO NOTHING RETURNING id
), t AS (
    -- The task runs of the runs created (none of a run the database left out).
    INSERT INTO {qn(TaskRun._meta.db_table)} ({qn("run_id")}, {", ".join(qn(f.column) for f in task_fields)})
    SELECT input.id, {task_values}
    FROM {unnest("t", task_fields, task_shape, "run_numbers")}
    JOIN input ON input.number = u.number JOIN r ON r.id = input.id
    RETURNING queue, tenant, state
), woken AS (
    -- The workers of each queue that received due work: about as many free slots as rows
    -- (channels.wake_due's counted payload).
    SELECT pg_notify(c.channel, CASE WHEN c.n > {MAX_TOKENS} THEN '' ELSE c.n || ' ' || (
        SELECT max(nextval('{WAKE_SEQUENCE}')) FROM generate_series(1, c.n)) END)
    FROM (SELECT q.channel, count(*) AS n FROM t
          JOIN unnest(%(queues)s::text[], %(channels)s::text[]) AS q(queue, channel) ON q.queue = t.queue
          WHERE t.state = {scheduled} GROUP BY q.channel) c
    UNION ALL
    -- The dispatchers only when a concurrency limit holds some of that work (theirs to admit).
    SELECT pg_notify('{DISPATCH_CHANNEL}', '')
    WHERE EXISTS (SELECT FROM t WHERE t.state = {scheduled} AND (%(every)s
        OR t.queue IN (SELECT queue FROM {QueueLimit._meta.db_table})
        OR t.tenant IN (SELECT tenant FROM {TenantLimit._meta.db_table})))
)
SELECT input.number, input.id FROM (SELECT count(*) FROM woken) w
LEFT JOIN (r JOIN input ON input.id = r.id) ON true
""")


def _graph(workflow: Workflow | None, version: WorkflowVersion | None,
           tasks: dict | None) -> tuple[WorkflowVersion | None, dict]:
    """The graph a new run follows: the given version or tasks, else the workflow's current version."""
    if workflow is not None:
        version = version or workflow.current_version
        if version is None:
            raise RunError(f"workflow {workflow.name!r} has no valid version yet: {workflow.sync_error or 'not synced'}",
                           field="workflow")
        tasks = tasks if tasks is not None else version.spec["tasks"]
    if not tasks:
        raise RunError("a run needs at least one task", field="tasks")
    return version, tasks


def _insert_run(run: Run, spec: dict, tasks: dict, due_at: datetime, now: datetime) -> tuple[Run, bool]:
    """Admit the run (when it is to start) and insert it and, unless it is over at birth, its task
    runs, in one statement (``insert_new_runs``); an existing run of the same idempotency key or
    (schedule, logical date) is answered instead. Only admission needs a transaction around it
    (its lock is held until the run is in): a run that asks none (a job) takes one round trip."""
    admitting = run.state == RunState.RUNNING and run.workflow is not None
    with transaction.atomic() if admitting else contextlib.nullcontext():
        if admitting:
            decision = admission.admit_one(run.workflow, run.lane)
            run.state, run.reason = decision.state, decision.reason
        apply_graph_options(run, spec, now)
        if not insert_new_runs([NewRun(run, tasks, due_at, admitted=True)], now):
            existing = _existing(run)
            if (run.idempotency_key and run.payload_hash and existing.payload_hash
                    and existing.payload_hash != run.payload_hash):
                raise IdempotencyConflict(run.idempotency_key, existing)
            return existing, False
    return run, True


def _existing(run: Run) -> Run:
    if run.idempotency_key:
        found = Run.objects.filter(idempotency_key=run.idempotency_key).first()
        if found is not None:
            return found
    return Run.objects.get(schedule=run.schedule, logical_date=run.logical_date)


def release_pending_run(run: Run, now: datetime | None = None) -> bool:
    """Start a run that was held back (PENDING): its root tasks become due now."""
    now = now or clock.now()
    spec = WorkflowVersion.objects.filter(pk=run.version_id).values_list("spec", flat=True).first() or {}
    timeout = spec.get("run_timeout")
    timeout_at = now + timedelta(seconds=float(timeout)) if timeout else None
    with transaction.atomic():
        if not Run.objects.filter(pk=run.pk, state=RunState.PENDING).update(
                state=RunState.RUNNING, timeout_at=timeout_at, reason=""):
            return False
        TaskRun.objects.filter(run=run, state=TaskState.WAITING, upstream=[]).update(
            state=TaskState.SCHEDULED, due_at=now
        )
    run.state, run.timeout_at, run.reason = RunState.RUNNING, timeout_at, ""
    return True


def trigger_workflow(
    workflow: Workflow,
    params: dict | None = None,
    *,
    trigger: str = Trigger.MANUAL,
    created_by=None,
    idempotency_key: str | None = None,
    logical_date: datetime | None = None,
    priority: int = 0,
    now: datetime | None = None,
) -> tuple[Run, bool]:
    """Start a run of a workflow now (UI, API, admin). Raises ParamError for bad params and
    RunError when the workflow cannot run (broken without a good version, removed)."""

    if workflow.current_version_id is None:
        raise RunError(f"workflow {workflow.name!r} cannot run: {workflow.sync_error or 'it has no valid version'}",
                       field="workflow")
    if not workflow.present:
        raise RunError(f"workflow {workflow.name!r} is no longer defined by any module", field="workflow")
    if logical_date is not None and (message := logical_date_error(logical_date)):
        raise RunError(message, field="logical_date")
    cleaned = clean_params(workflow.current_version.spec.get("params", {}), params)
    request = {"workflow": workflow.name, "params": cleaned,
               "logical_date": logical_date.isoformat() if logical_date else None}
    # A run past the workflow's max_active_runs is held back (pending), not refused: admission.
    return create_run(
        workflow, trigger=trigger, params=cleaned, logical_date=logical_date, created_by=created_by,
        idempotency_key=idempotency_key, request_payload=request if idempotency_key else None,
        priority=priority, now=now,
    )
