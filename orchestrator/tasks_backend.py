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
rolls back never runs. The job's reference is the module attribute that holds the ``Task``
object; the worker unwraps it to ``Task.func`` and passes a ``TaskContext`` when the task
``takes_context``. ``OPTIONS`` may set ``max_attempts`` (default 1), ``timeout`` (seconds) and
``retry_delay``/``retry_backoff``/``retry_max_delay`` for every task of this backend.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import Task, TaskError, TaskResult, TaskResultStatus
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist

from orchestrator import registry
from orchestrator.models import Attempt, AttemptOutcome, Run, TaskRun, TaskState, Trigger

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

FAILED_OUTCOMES = (AttemptOutcome.FAILED, AttemptOutcome.TIMED_OUT, AttemptOutcome.LOST, AttemptOutcome.CANCELLED)

# The last line of a Python traceback: "ValueError: boom" or "package.module.Error: boom".
_EXCEPTION_LINE = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Z]\w*)(?::|$)")


def task_ref(task: Task) -> str:
    """``module:qualname`` of the attribute holding the Task (``@task`` replaces the function)."""
    return f"{task.func.__module__}:{task.func.__qualname__}"


def exception_class_path(attempt: Attempt) -> str:
    """The dotted path of the exception that ended an attempt, read from its traceback's last
    line (Python writes builtins without a module, others with it)."""
    for text in (attempt.traceback, attempt.error):
        lines = [line for line in (text or "").strip().splitlines() if line.strip()]
        if not lines:
            continue
        match = _EXCEPTION_LINE.match(lines[-1].strip())
        if match:
            name = match.group(1)
            return name if "." in name else f"builtins.{name}"
    if attempt.outcome == AttemptOutcome.TIMED_OUT:
        return "builtins.TimeoutError"
    return "builtins.Exception"


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
        from orchestrator import jobs

        self.validate_task(task)
        options = self.options
        spec_extra = {"django_task": {"backend": self.alias, "takes_context": task.takes_context,
                                      "run_after": task.run_after.isoformat() if task.run_after else None}}
        for key in ("retry_delay", "retry_backoff", "retry_max_delay"):
            if key in options:
                spec_extra[key] = options[key]
        try:
            run, _created = jobs.enqueue(
                task_ref(task), args=list(args), kwargs=dict(kwargs), run_after=task.run_after,
                queue=task.queue_name, priority=task.priority, max_attempts=int(options.get("max_attempts", 1)),
                timeout=options.get("timeout"), spec_extra=spec_extra,
            )
        except jobs.JobError as exc:
            raise InvalidTask(str(exc)) from exc
        return self._result(task, run, run.task_runs.get(), [])

    def get_result(self, result_id) -> TaskResult:
        try:
            task_run_id = int(str(result_id))
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(f"no task result {result_id!r}: ids are whole numbers") from None
        if not 0 < task_run_id < 2**63:
            raise TaskResultDoesNotExist(f"no task result {result_id!r}")
        task_run = (TaskRun.objects.select_related("run")
                    .filter(pk=task_run_id, run__trigger=Trigger.JOB, run__workflow__isnull=True).first())
        if task_run is None:
            raise TaskResultDoesNotExist(f"no task result {result_id!r}")
        task = self._task(task_run)
        attempts = list(Attempt.objects.filter(task_run=task_run).select_related("worker").order_by("number"))
        return self._result(task, task_run.run, task_run, attempts)

    def _task(self, task_run: TaskRun) -> Task:
        ref = task_run.spec.get("ref", "")
        # Looked up, never imported: the reference comes from a database row.
        found = registry.get(ref)
        if found is None:
            raise TaskResultDoesNotExist(f"the task {ref!r} of this result is not registered in this process "
                                         "(its module was not imported)")
        if isinstance(found, Task):
            return found
        if callable(found):
            # A plain-function job (enqueued by the API or jobs.enqueue): still readable here.
            try:
                return self.task_class(func=found, backend=self.alias, queue_name=task_run.queue,
                                       priority=max(-100, min(100, task_run.priority)))
            except InvalidTask as exc:
                raise TaskResultDoesNotExist(f"job {task_run.run_id} is not a task: {exc}") from None
        raise TaskResultDoesNotExist(f"{ref!r} is neither a task nor a function")

    def _result(self, task: Task, run: Run, task_run: TaskRun, attempts: list[Attempt]) -> TaskResult:
        spec = task_run.spec
        run_after = (spec.get("django_task") or {}).get("run_after")
        if run_after and task.run_after is None:
            # The Task object imported by reference has no run_after; the enqueued one had.
            task = task.using(run_after=datetime.fromisoformat(run_after))
        result = TaskResult(
            task=task,
            id=str(task_run.pk),
            status=STATUS.get(task_run.state, TaskResultStatus.READY),
            enqueued_at=run.created_at,
            started_at=attempts[0].started_at if attempts else task_run.started_at,
            finished_at=task_run.finished_at if task_run.state not in (TaskState.WAITING, TaskState.SCHEDULED,
                                                                       TaskState.QUEUED, TaskState.RUNNING)
            else None,
            last_attempted_at=attempts[-1].started_at if attempts else None,
            args=spec.get("args", []),
            kwargs=spec.get("kwargs", {}),
            backend=self.alias,
            errors=[TaskError(exception_class_path=exception_class_path(attempt),
                              traceback=attempt.traceback or attempt.error)
                    for attempt in attempts if attempt.outcome in FAILED_OUTCOMES],
            worker_ids=[attempt.worker.name if attempt.worker else f"attempt-{attempt.number}" for attempt in attempts],
        )
        if task_run.state == TaskState.SUCCEEDED:
            object.__setattr__(result, "_return_value", task_run.result)
        return result
