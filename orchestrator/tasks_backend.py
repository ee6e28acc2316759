"""A backend for Django's task framework (``django.tasks``): a function decorated with
``@task`` is enqueued as one of our jobs, so it runs on our workers with our retries, logs,
dead-letter queue and UI.

    TASKS = {"default": {"BACKEND": "orchestrator.tasks_backend.OrchestratorBackend"}}

    from django.tasks import task

    @task(priority=10, queue_name="default")
    def send_invoice(invoice_id):
        ...

    result = send_invoice.enqueue(42)          # a job: a run of one task; result.id is the task run's id
    result = send_invoice.get_result(result.id)

Enqueueing inserts rows in the caller's transaction: a task enqueued in a transaction that
rolls back never runs. Django 6.1's task backends have no bulk path (``BaseTaskBackend`` defines
``enqueue`` and ``aenqueue`` only); many jobs at once go through ``orchestrator.jobs.enqueue_many``
(one statement for the batch). Arguments are checked as Django's own backends check them (TypeError or
ValueError, before anything is written), and JSON's missing NaN and Infinity are refused the same
way. ``enqueue()`` answers with the result as of the enqueue (READY), never a later state;
``get_result()`` reads the task run, its run and its attempts in one statement, so the status,
times, errors and workers it reports belong to one moment. The options of ``.using()`` (priority,
queue, run_after) are stored with the job and come back in ``get_result(...).task``.

The worker's child sends ``task_started`` before the function runs and ``task_finished`` when it
returned or raised, in the process that ran it (with the exception being handled, so Django's
logger records its traceback); the outcome is written to the database moments later. An attempt
killed for its timeout or lost with its worker sends no ``task_finished``: its TaskError says why.
Errors carry the class and traceback of the exception object itself, also for the failures the
product detects (a return value JSON cannot hold, a module the worker cannot import).

``OPTIONS`` may set ``max_attempts`` (default 1), ``timeout`` (seconds) and
``retry_delay``/``retry_backoff``/``retry_max_delay`` for every task of this backend. Without
``QUEUES`` any queue name is valid: workers choose their queues by name.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import Task, TaskError, TaskResult, TaskResultStatus
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils.json import normalize_json

from orchestrator import clock, jobs, limits, registry, results, retries
from orchestrator.models import TaskRun
from orchestrator.states import AttemptOutcome, TaskState, Trigger

STATUS = {
    TaskState.WAITING: TaskResultStatus.READY,
    TaskState.SCHEDULED: TaskResultStatus.READY,  # also: waiting for its next attempt
    TaskState.QUEUED: TaskResultStatus.READY,
    TaskState.RUNNING: TaskResultStatus.RUNNING,
    TaskState.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    TaskState.FAILED: TaskResultStatus.FAILED,
    TaskState.DEAD: TaskResultStatus.FAILED,
    TaskState.UPSTREAM_FAILED: TaskResultStatus.FAILED,
    TaskState.SKIPPED: TaskResultStatus.FAILED,
    TaskState.CANCELLED: TaskResultStatus.FAILED,  # "unable to start" in Django's terms
}
FINISHED = {TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED}

FAILED_OUTCOMES = (AttemptOutcome.FAILED, AttemptOutcome.TIMED_OUT, AttemptOutcome.LOST, AttemptOutcome.CANCELLED)

# Attempts that the worker did not see end (its child was killed, or the worker went silent) have
# no exception object; these classes say what happened.
ENDED_WITHOUT_EXCEPTION = {
    AttemptOutcome.TIMED_OUT: "builtins.TimeoutError",
    AttemptOutcome.LOST: "orchestrator.executor.AttemptLost",
    AttemptOutcome.CANCELLED: "orchestrator.executor.AttemptCancelled",
}

# The job's task run, its run and every attempt with its worker's name, in one statement: one
# snapshot, so the status and the attempts always agree (a task run is claimed and its attempt
# inserted in one transaction). Jobs only: a workflow's task run is not a django.tasks result.
RESULT_SQL = f"""
SELECT tr.state, tr.spec, tr.result, tr.finished_at, tr.queue, tr.priority, r.created_at,
       COALESCE(json_agg(json_build_object(
           'number', a.number, 'outcome', a.outcome, 'started_at', a.started_at, 'error', a.error,
           'traceback', a.traceback, 'exception_class', a.exception_class, 'worker', w.name)
           ORDER BY a.number) FILTER (WHERE a.id IS NOT NULL), '[]')
FROM orchestrator_taskrun tr
JOIN orchestrator_run r ON r.id = tr.run_id
LEFT JOIN orchestrator_attempt a ON a.task_run_id = tr.id
LEFT JOIN orchestrator_worker w ON w.id = a.worker_id
WHERE tr.id = %s AND r.trigger = '{Trigger.JOB}' AND r.workflow_id IS NULL
GROUP BY tr.id, r.id
"""


def task_ref(task: Task) -> str:
    """``module:qualname`` of the attribute holding the Task (``@task`` replaces the function)."""
    return f"{task.func.__module__}:{task.func.__qualname__}"


def json_arguments(args, kwargs) -> tuple[list, dict]:
    """The arguments as Django's backends take them (TypeError for a type JSON cannot hold,
    ValueError for bytes that are not UTF-8), and refused as well when JSON has no value for them
    (NaN, Infinity), before anything is written."""
    args, kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
    try:
        json.dumps([args, kwargs], allow_nan=False)
    except ValueError:
        bad = next((value for value in _floats([args, kwargs]) if not math.isfinite(value)), None)
        raise ValueError(f"Unsupported value: {bad!r} (JSON has no NaN or Infinity)") from None
    return args, kwargs


def _floats(value):
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _floats(item)
    elif isinstance(value, list):
        for item in value:
            yield from _floats(item)


@dataclass(frozen=True, slots=True, kw_only=True)
class OrchestratorTask(Task):
    """Django's Task, callable like the function it wraps (``add(1, 2)`` runs it here and now).

    Being callable is what lets the job reference name the Task itself: enqueueing checks that a
    reference names something callable, and the worker unwraps a Task to its ``func``."""

    def __call__(self, *args, **kwargs):
        return self.call(*args, **kwargs)


class OrchestratorBackend(BaseTaskBackend):
    task_class = OrchestratorTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias, params):
        super().__init__(alias, params)
        if "QUEUES" not in params:
            # Workers choose their queues by name, so any name is valid unless QUEUES lists some.
            self.queues = set()

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        # Defining a task registers it: workers and the API run only registered references.
        registry.register(task, task_ref(task))

    def enqueue(self, task: Task, args, kwargs) -> TaskResult:

        self.validate_task(task)
        args, kwargs = json_arguments(args, kwargs)
        options = self.options
        # What .using() chose travels with the job, so get_result() gives the same Task back.
        spec_extra = {"django_task": {
            "backend": self.alias, "takes_context": task.takes_context, "priority": task.priority,
            "queue_name": task.queue_name, "run_after": task.run_after.isoformat() if task.run_after else None,
        }}
        # OPTIONS name the retry policy's values as a spec does; enqueue checks them.
        retry = {key: options[key] for key in retries.SPEC_KEYS.values() if key in options}
        try:
            run, _created = jobs.enqueue(
                task_ref(task), args=args, kwargs=kwargs, run_after=task.run_after,
                queue=task.queue_name, priority=task.priority, spec_extra={**spec_extra, **retry},
                timeout=options.get("timeout"),
            )
        except jobs.JobError as exc:
            raise InvalidTask(str(exc)) from exc
        # The result as of the enqueue: the row may already be claimed (outside this transaction),
        # but that is a later state, for get_result() to report.
        task_run_id = TaskRun.objects.filter(run_id=run.pk).values_list("pk", flat=True).get()
        result = TaskResult(
            task=task, id=str(task_run_id), status=TaskResultStatus.READY, enqueued_at=run.created_at,
            started_at=None, finished_at=None, last_attempted_at=None, args=args, kwargs=kwargs,
            backend=self.alias, errors=[], worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id) -> TaskResult:
        task_run_id = _result_id(result_id)
        with connection.cursor() as cursor:
            cursor.execute(RESULT_SQL, [task_run_id])
            row = cursor.fetchone()
        if row is None:
            raise TaskResultDoesNotExist(f"no task result {result_id!r}")
        state, spec, value, finished_at, queue, priority, enqueued_at, attempts = row
        spec = json.loads(spec) if isinstance(spec, str) else spec
        attempts = json.loads(attempts) if isinstance(attempts, str) else attempts
        task = self._task(spec, queue, priority)
        status = STATUS.get(state, TaskResultStatus.READY)
        starts = [datetime.fromisoformat(a["started_at"]) for a in attempts]
        result = TaskResult(
            task=task, id=str(task_run_id), status=status, enqueued_at=enqueued_at,
            started_at=starts[0] if starts else None,
            finished_at=finished_at if status in FINISHED else None,
            last_attempted_at=starts[-1] if starts else None,
            args=spec.get("args", []), kwargs=spec.get("kwargs", {}), backend=self.alias,
            errors=_errors(attempts),
            worker_ids=[a["worker"] or f"attempt-{a['number']}" for a in attempts],
        )
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value",
                               results.load(json.loads(value) if isinstance(value, str) else value))
        return result

    def _task(self, spec: dict, queue: str, priority: int) -> Task:
        ref = spec.get("ref", "")
        # Looked up, never imported: the reference comes from a database row.
        found = registry.get(ref)
        if found is None:
            raise TaskResultDoesNotExist(f"the task {ref!r} of this result is not registered in this process "
                                         "(its module was not imported)")
        options = spec.get("django_task") or {}
        if isinstance(found, Task):
            # The options the enqueued Task had (.using()), without validating them again: a
            # result stays readable after the settings changed.
            run_after = options.get("run_after")
            return dataclasses.replace(
                found, priority=options.get("priority", found.priority),
                queue_name=options.get("queue_name", found.queue_name),
                run_after=datetime.fromisoformat(run_after) if run_after else None,
                backend=options.get("backend", found.backend),
            )
        if callable(found):
            # A plain-function job (enqueued by the API or jobs.enqueue): still readable here.
            try:
                return self.task_class(func=found, backend=self.alias, queue_name=queue,
                                       priority=max(limits.PRIORITY_MIN, min(limits.PRIORITY_MAX, priority)))
            except InvalidTask as exc:
                raise TaskResultDoesNotExist(f"this job's function is not a task: {exc}") from None
        raise TaskResultDoesNotExist(f"{ref!r} is neither a task nor a function")


# --- in the worker's child process -----------------------------------------------------------

def attempt_started(task: Task, task_run_id: int) -> TaskResult:
    """The result as this attempt starts (RUNNING, with this worker among its workers), sent as
    ``task_started`` and handed to a task that takes a context."""
    result = task.get_backend().get_result(task_run_id)
    task_started.send(type(task.get_backend()), task_result=result)
    return result


def attempt_finished(started: TaskResult, value=None, exc: BaseException | None = None,
                     tb: str = "") -> None:
    """Send ``task_finished`` for this attempt, from the process that ran it: SUCCESSFUL with the
    return value, or FAILED with this attempt's error (call it inside the ``except`` block)."""
    now = clock.now()
    if exc is None:
        finished = dataclasses.replace(started, status=TaskResultStatus.SUCCESSFUL, finished_at=now)
        object.__setattr__(finished, "_return_value", value)
    else:
        kind = type(exc)
        error = TaskError(exception_class_path=f"{kind.__module__}.{kind.__qualname__}", traceback=tb)
        finished = dataclasses.replace(started, status=TaskResultStatus.FAILED, finished_at=now,
                                       errors=[*started.errors, error])
    task_finished.send(type(started.task.get_backend()), task_result=finished)


def _result_id(result_id) -> int:
    """A result id as the task run id it is; TaskResultDoesNotExist when it cannot be one."""
    try:
        task_run_id = int(str(result_id))
    except (TypeError, ValueError):
        raise TaskResultDoesNotExist(f"no task result {result_id!r}: ids are whole numbers") from None
    if not 0 < task_run_id < 2**63:
        raise TaskResultDoesNotExist(f"no task result {result_id!r}")
    return task_run_id


def _errors(attempts: list[dict]) -> list[TaskError]:
    """The failed attempts' errors, each with its exception class (or what ended it)."""
    return [TaskError(exception_class_path=a["exception_class"] or ENDED_WITHOUT_EXCEPTION.get(
                          a["outcome"], "orchestrator.executor.TaskFailure"),
                      traceback=a["traceback"] or a["error"])
            for a in attempts if a["outcome"] in FAILED_OUTCOMES]
