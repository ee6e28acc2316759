"""``wf.test()``: run a whole workflow in the calling process, for a project's own unit tests.

    result = etl.test(params={"orders": 3}, logical_date=datetime(2026, 3, 1, tzinfo=UTC))
    assert result.state == "succeeded"
    assert result["load"].result == {"total": 42}
    assert result["transform"].state == "succeeded" and len(result["transform"].instances) == 3

No scheduler, dispatcher or worker: the run and its task runs are rows like any run's, and the
same resolver decides what happens (the retry rule, trigger rules, mapping, branches, sensors),
but this process claims the due task runs of its run and executes them itself, one at a time.
Time is a clock of the runner's own that jumps to the next due time, so a retry delay or a
sensor's interval costs nothing. The callbacks the run enqueues are executed too.

Everything is written in a transaction that is rolled back at the end (``keep=True`` commits
it, and the run then shows in the UI with trigger "test"), so it needs database access (with
pytest-django, the ``db`` fixture) and leaves nothing behind. Limits: task timeouts are not
enforced (the code runs in this process) and dataset events start no consumer (no scheduler).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection, transaction

from orchestrator import clock as clocks
from orchestrator import executor, resolver, taskcontext
from orchestrator.callbacks import RUN_EVENTS
from orchestrator.definition import callables, callback_ref
from orchestrator.models import Run, Trigger
from orchestrator.params import ParamError, clean_params
from orchestrator.resolver import Ending
from orchestrator.runs import create_run
from orchestrator.states import AttemptOutcome, TaskState
from orchestrator.validation import MODULE_LEVEL, validate

# --- SQL ---------------------------------------------------------------------------------------

# The due task runs of this run and of the callback jobs it enqueued, in the order a dispatcher
# would take them.
DUE = f"""
SELECT id FROM orchestrator_taskrun
WHERE state = '{TaskState.SCHEDULED}' AND due_at <= %(now)s AND (run_id = %(run)s OR id = ANY (%(jobs)s))
ORDER BY priority DESC, due_at, id
"""
# When the next task of this run (or its callback jobs) comes due: the local clock jumps there.
NEXT_DUE = f"""
SELECT min(due_at) FROM orchestrator_taskrun
WHERE state = '{TaskState.SCHEDULED}' AND (run_id = %(run)s OR id = ANY (%(jobs)s))
"""

# Queue, then claim, the way the dispatcher and a worker would (attempt number incremented).
QUEUE = (f"UPDATE orchestrator_taskrun SET state = '{TaskState.QUEUED}', queued_at = %(now)s "
         f"WHERE id = %(id)s AND state = '{TaskState.SCHEDULED}'")
# One statement, as a worker claims: the task run starts and its attempt row exists together.
CLAIM = f"""
WITH t AS (
    UPDATE orchestrator_taskrun SET state = '{TaskState.RUNNING}', attempts = attempts + 1, started_at = %(now)s
    WHERE id = %(id)s AND state = '{TaskState.QUEUED}'
    RETURNING id, run_id, task, attempts, spec, timeout
), a AS (
    INSERT INTO orchestrator_attempt (task_run_id, number, worker_id, outcome, started_at, error, traceback, log_path)
    SELECT id, attempts, NULL, '{AttemptOutcome.RUNNING}', %(now)s, '', '', '' FROM t
)
SELECT id, run_id, task, attempts, spec, timeout FROM t
"""

# The callback jobs enqueued for this run (their context names it).
CALLBACK_JOBS = """
SELECT t.id FROM orchestrator_taskrun t JOIN orchestrator_run r ON r.id = t.run_id
WHERE r.trigger = 'job' AND r.workflow_id IS NULL AND t.spec ? 'callback'
  AND (t.spec->'args'->0->>'run_id')::bigint = %(run)s
"""

# Every task run of the run, instances included, for the outcome the caller asserts on.
RESULTS = """
SELECT id, task, map_index, state, result, attempts, error FROM orchestrator_taskrun
WHERE run_id = %(run)s ORDER BY task, map_index
"""


@dataclass
class TaskOutcome:
    """One task's end in a local run. For a mapped task, ``result`` is the list of its instances'
    results and ``instances`` their own outcomes, by map index."""

    name: str
    state: str
    result: object = None
    attempts: int = 0
    error: str = ""
    log: str = ""
    map_index: int | None = None
    instances: list[TaskOutcome] = field(default_factory=list)


@dataclass
class LocalRun:
    run_id: int
    state: str
    tasks: dict[str, TaskOutcome]
    callbacks: list[dict] = field(default_factory=list)  # each: {"ref", "event", "state", "error"}

    def __getitem__(self, name: str) -> TaskOutcome:
        return self.tasks[name]

    @property
    def results(self) -> dict:
        return {name: outcome.result for name, outcome in self.tasks.items()}


class LocalRunError(Exception):
    """The workflow cannot be run locally as declared (its definition or params are invalid)."""


def run_workflow(wf, params: dict | None = None, logical_date: datetime | None = None, *,
                 keep: bool = False, max_attempts_total: int = 100_000) -> LocalRun:
    # Functions defined inside a test are fine here: this process holds them.
    errors = [error for error in validate(wf) if MODULE_LEVEL not in error.message]
    if errors:
        raise LocalRunError("\n".join(str(error) for error in errors))
    spec = wf.to_spec()
    try:
        cleaned = clean_params(spec.get("params", {}), params)
    except ParamError as exc:
        raise LocalRunError(f"workflow {wf.name!r}: params: {exc}") from None
    clock = clocks.FakeClock(clocks.now())
    with clocks.pinned(clock), transaction.atomic():
        outcome = _Runner(wf, spec, cleaned, logical_date, clock, max_attempts_total).run()
        if not keep:
            transaction.set_rollback(True)
    return outcome


class _Runner:
    def __init__(self, wf, spec, params, logical_date, clock, max_attempts_total):
        self.wf, self.spec, self.params, self.clock = wf, spec, params, clock
        self.logical_date = logical_date or clock.now()
        # The functions of the workflow this process holds, by reference: its tasks and callbacks.
        self.functions = {task.ref: task for task in wf.tasks.values() if task.fn is not None}
        for callbacks in [wf.callbacks, *(task.callbacks for task in wf.tasks.values())]:
            for value in callbacks.values():
                self.functions.update({callback_ref(fn): fn for fn in callables(value) if callback_ref(fn)})
        self.budget = max_attempts_total
        self.logs: dict[int, list[str]] = {}
        self.callbacks: list[dict] = []

    def run(self) -> LocalRun:
        run, _ = create_run(None, trigger=Trigger.TEST, tasks=self.spec["tasks"], params=self.params,
                            logical_date=self.logical_date, now=self.clock.now())
        self.run_id = run.pk
        while self.step():
            pass
        state = Run.objects.values_list("state", flat=True).get(pk=run.pk)
        self.run_callbacks(state)
        return LocalRun(run.pk, state, self.outcomes(), self.callbacks)

    def jobs(self, cursor) -> list[int]:
        cursor.execute(CALLBACK_JOBS, {"run": self.run_id})
        return [row[0] for row in cursor.fetchall()]

    def step(self) -> bool:
        """Execute what is due now, or move the clock to the next due time; False when done."""
        with connection.cursor() as cursor:
            jobs = self.jobs(cursor)
            cursor.execute(DUE, {"now": self.clock.now(), "run": self.run_id, "jobs": jobs})
            due = [row[0] for row in cursor.fetchall()]
            if not due:
                cursor.execute(NEXT_DUE, {"run": self.run_id, "jobs": jobs})
                upcoming = cursor.fetchone()[0]
                if upcoming is None:
                    return False  # nothing scheduled: the run (and its callbacks) ended
                self.clock.set(max(upcoming, self.clock.now()))
                return True
        for task_run_id in due:
            self.execute(task_run_id)
        return True

    def execute(self, task_run_id: int) -> None:
        self.budget -= 1
        if self.budget < 0:
            raise LocalRunError(f"workflow {self.wf.name!r}: gave up after too many attempts (a sensor that never "
                                "answers yes without a timeout?)")
        now = self.clock.now()
        with connection.cursor() as cursor:
            cursor.execute(QUEUE, {"id": task_run_id, "now": now})
            cursor.execute(CLAIM, {"id": task_run_id, "now": now})
            row = cursor.fetchone()
            if row is None:
                return
            task_run_id, run_id, task, number, spec, timeout = row
            message = {"id": task_run_id, "run_id": run_id, "task": task, "number": number,
                       "spec": json.loads(spec) if isinstance(spec, str) else spec, "timeout": timeout}
            taskcontext.fill(cursor, [message])
        stream = io.StringIO()
        # The workflow object this process holds vouches for its own tasks and callbacks.
        declared = self.spec["tasks"].get(task) if message["spec"].get("call") != "job" else None
        reply = executor.run(message, log_stream=stream, declared=declared, functions=self.functions)
        self.logs.setdefault(task_run_id, []).append(stream.getvalue())
        ending = Ending(*reply, job=message["spec"].get("call") == "job", run_id=run_id)
        resolver.end_attempts([ending], now=self.clock.now())
        if ending.job and message["spec"].get("callback"):
            context = message["spec"]["args"][0]
            self.callbacks.append({"ref": message["spec"]["ref"], "event": context["event"], "task": context["task"],
                                   "outcome": ending.outcome, "error": ending.error})

    def run_callbacks(self, state: str) -> None:
        """The workflow's own on_success/on_failure: its run has no workflow row to read them
        from, so they are called here, in this process, like the jobs would call them."""
        event = RUN_EVENTS.get(state)
        for fn in callables(self.wf.callbacks.get(event)) if event else ():
            context = {"event": event, "workflow": self.wf.name, "run_id": self.run_id,
                       "logical_date": self.logical_date.isoformat(), "task": None, "task_run_id": None,
                       "map_index": None, "attempt": None, "state": state, "error": ""}
            outcome, error = "succeeded", ""
            try:
                fn(context)
            except Exception as exc:  # noqa: BLE001 - reported in the outcome, like a failed job
                outcome, error = "failed", f"{type(exc).__name__}: {exc}"
            self.callbacks.append({"ref": callback_ref(fn), "event": event, "task": None,
                                   "outcome": outcome, "error": error})

    def outcomes(self) -> dict[str, TaskOutcome]:
        with connection.cursor() as cursor:
            cursor.execute(RESULTS, {"run": self.run_id})
            rows = cursor.fetchall()
        tasks: dict[str, TaskOutcome] = {}
        for task_run_id, task, map_index, state, result, attempts, error in rows:
            outcome = TaskOutcome(task, state, _json(result), attempts, error, "".join(self.logs.get(task_run_id, [])),
                                  map_index if map_index >= 0 else None)
            if map_index < 0:
                outcome.instances = tasks[task].instances if task in tasks else []
                tasks[task] = outcome
            else:
                tasks.setdefault(task, TaskOutcome(task, "")).instances.append(outcome)
        return tasks


def _json(value):
    return json.loads(value) if isinstance(value, str) else value

