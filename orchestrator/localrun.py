"""``wf.test()``: run a whole workflow in the calling process, for a project's own unit tests.

    result = etl.test(params={"orders": 3}, logical_date=datetime(2026, 3, 1, tzinfo=UTC))
    assert result.state == "succeeded"
    assert result["load"].result == {"total": 42}
    assert result["transform"].state == "succeeded" and len(result["transform"].instances) == 3

No scheduler, dispatcher or worker process: the run and its task runs are rows like any run's,
claimed with the worker's own claim (``worker.batch``: the same statement, in dispatch order)
and decided by the same resolver (the retry rule, trigger rules, mapping, branches, sensors);
this process executes what it claims itself, one task run at a time. The task runs of the run and
of the callback jobs it enqueues are put in a queue of the run's own, so the claim takes nothing
else that is due in the database, and concurrency limits do not apply to them.
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
from orchestrator import executor, resolver, results
from orchestrator.callbacks import RUN_EVENTS
from orchestrator.conf import log_storage
from orchestrator.definition import callables, callback_ref
from orchestrator.due import Limits
from orchestrator.models import Run
from orchestrator.params import ParamError, clean_params
from orchestrator.resolver import Ending
from orchestrator.runs import create_run
from orchestrator.states import Trigger
from orchestrator.validation import MODULE_LEVEL, validate
from orchestrator.worker.batch import Batch

# --- SQL ---------------------------------------------------------------------------------------

# The task runs of this run, and of the callback jobs it enqueued (their context names it), in
# the run's own queue: what the worker's claim takes, then, is this run's work and only it.
TO_OWN_QUEUE = """
UPDATE orchestrator_taskrun SET queue = %(queue)s WHERE run_id = %(run)s AND queue <> %(queue)s
"""
CALLBACK_JOBS_TO_OWN_QUEUE = f"""
UPDATE orchestrator_taskrun t SET queue = %(queue)s FROM orchestrator_run r
WHERE r.id = t.run_id AND r.trigger = '{Trigger.JOB}' AND r.workflow_id IS NULL AND t.spec ? 'callback'
  AND (t.spec->'args'->0->>'run_id')::bigint = %(run)s AND t.queue <> %(queue)s
"""
# Back to the queues they declare, for a run that is kept.
TO_DECLARED_QUEUES = """
UPDATE orchestrator_taskrun SET queue = COALESCE(spec->>'queue', 'default') WHERE queue = %(queue)s
"""
# The worker's claim leaves work under a concurrency limit to the dispatchers: none applies here.
NO_LIMITS = Limits(queues={}, queue_default=None, tenants={}, tenant_default=None)

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
    stored = []
    with clocks.pinned(clock), transaction.atomic():
        outcome = _Runner(wf, spec, cleaned, logical_date, clock, max_attempts_total).run()
        if not keep:
            with connection.cursor() as cursor:
                stored = results.names_of_runs(cursor, [outcome.run_id])
            transaction.set_rollback(True)
    for name in stored:  # results too large for a row go with the rows rolled back
        log_storage().delete(name)
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
        self.queue = f"wf.test.{run.pk}"
        self.batch = Batch([self.queue], poll=float("inf"))  # its limits are never read again
        self.batch.limits = NO_LIMITS
        self.move(TO_OWN_QUEUE)
        while self.step():
            pass
        self.move(TO_DECLARED_QUEUES)
        state = Run.objects.values_list("state", flat=True).get(pk=run.pk)
        self.run_callbacks(state)
        return LocalRun(run.pk, state, self.outcomes(), self.callbacks)

    def move(self, sql: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(sql, {"queue": self.queue, "run": self.run_id})

    def step(self) -> bool:
        """Claim and execute one due task run, or move the clock to the next due time; False when
        nothing is scheduled any more (the run and its callbacks ended)."""
        self.move(CALLBACK_JOBS_TO_OWN_QUEUE)
        now = self.clock.now()
        claimed = self.batch.claim(1, now)
        if claimed:
            self.execute(claimed[0])
            return True
        upcoming = self.batch.claimed_next_due
        if upcoming is None:
            return False
        if upcoming <= now:
            raise LocalRunError(f"workflow {self.wf.name!r}: a due task run could not be claimed "
                                "(held by another transaction)")
        self.clock.set(upcoming)
        return True

    def execute(self, message: dict) -> None:
        self.budget -= 1
        if self.budget < 0:
            raise LocalRunError(f"workflow {self.wf.name!r}: gave up after too many attempts (a sensor that never "
                                "answers yes without a timeout?)")
        task_run_id, run_id, task = message["id"], message["run_id"], message["task"]
        stream = io.StringIO()
        # The workflow object this process holds vouches for its own tasks and callbacks.
        declared = self.spec["tasks"].get(task) if message["spec"].get("call") != "job" else None
        reply = executor.run(message, log_stream=stream, declared=declared, functions=self.functions)
        self.logs.setdefault(task_run_id, []).append(stream.getvalue())
        ending = Ending(*reply, job=message["spec"].get("call") == "job", run_id=run_id, check=message.get("check"))
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
            outcome = TaskOutcome(task, state, results.load(_json(result)), attempts, error, "".join(self.logs.get(task_run_id, [])),
                                  map_index if map_index >= 0 else None)
            if map_index < 0:
                outcome.instances = tasks[task].instances if task in tasks else []
                tasks[task] = outcome
            else:
                tasks.setdefault(task, TaskOutcome(task, "")).instances.append(outcome)
        return tasks


def _json(value):
    return json.loads(value) if isinstance(value, str) else value

