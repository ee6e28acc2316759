"""Django's task framework on our backend: ``@task`` functions enqueued with ``.enqueue()`` run on
real worker processes, and ``get_result`` maps our run, task run and attempts to a TaskResult.

The task functions live in this module, which the workers import at start-up (named in
ORCHESTRATOR_JOB_MODULES): a worker runs only registered tasks."""

import asyncio
import signal
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.tasks import TaskResultStatus, default_task_backend, task
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.utils import timezone

from orchestrator.models import Run, TaskRun, TaskState, Worker
from orchestrator.runs import create_run
from tests.conftest import process_env, wait_for

FAST = {"ORCHESTRATOR_HEARTBEAT_SECONDS": "0.5", "ORCHESTRATOR_POLL_SECONDS": "0.5"}


class GrumpyError(Exception):
    pass


@task
def add(a, b):
    return a + b


@task(priority=50)
def greet(name, *, punctuation="!"):
    return {"greeting": f"hello {name}{punctuation}"}


@task
def explode(message):
    raise GrumpyError(message)


@task
def divide(a, b):
    return a / b


@task(takes_context=True)
def which_attempt(context, label):
    return {"label": label, "attempt": context.attempt, "id": context.task_result.id}


@task
async def slow_double(n):
    await asyncio.sleep(0.01)
    return n * 2


@task
def touch(path):
    Path(path).write_text("ran")
    return path


def result_of(result_id):
    return default_task_backend.get_result(result_id)


def finished(result_id):
    result = result_of(result_id)
    return result if result.is_finished else None


@pytest.mark.django_db(transaction=True)
def test_tasks_run_on_a_real_worker_and_report_their_results(processes, tmp_path):
    env = process_env(ORCHESTRATOR_DATA_DIR=str(tmp_path / "data"), **FAST,
                      ORCHESTRATOR_JOB_MODULES=f"workflows.jobs,{__name__}")
    never = tmp_path / "never-ran"
    # Enqueued in a transaction that rolls back: nothing is stored, so nothing can ever run it.
    with pytest.raises(RuntimeError), transaction.atomic():
        touch.enqueue(str(never))
        raise RuntimeError("the caller changes its mind")
    assert not Run.objects.exists()

    results = {
        "add": add.enqueue(2, 3),
        "greet": greet.enqueue("ada", punctuation="?"),
        "explode": explode.enqueue("no coffee"),
        "divide": divide.enqueue(1, 0),
        "context": which_attempt.enqueue("first"),
        "async": slow_double.enqueue(21),
        "later": touch.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(str(tmp_path / "later")),
    }
    for result in results.values():
        assert result.status == TaskResultStatus.READY and not result.is_finished
        assert result.enqueued_at is not None and result.worker_ids == []

    processes.start("dispatcher", env=env)
    worker = processes.start("worker", "--queues", "default", "--concurrency", "2", env=env)
    ids = {name: r.id for name, r in results.items() if name != "later"}
    done = {name: wait_for(lambda i=i: finished(i), 30, message=f"task {name} to finish") for name, i in ids.items()}

    add_result = add.get_result(results["add"].id)
    assert add_result.status == TaskResultStatus.SUCCESSFUL and add_result.return_value == 5
    assert add_result.enqueued_at <= add_result.started_at <= add_result.finished_at
    assert add_result.last_attempted_at == add_result.started_at
    assert add_result.worker_ids == [Worker.objects.get(pid=worker.pid).name] and add_result.attempts == 1
    assert add_result.errors == [] and (add_result.args, add_result.kwargs) == ([2, 3], {})

    assert done["greet"].return_value == {"greeting": "hello ada?"}
    assert TaskRun.objects.get(pk=results["greet"].id).priority == 50
    assert done["async"].return_value == 42
    assert done["context"].return_value == {"label": "first", "attempt": 1, "id": results["context"].id}

    failed = done["explode"]
    assert failed.status == TaskResultStatus.FAILED
    [error] = failed.errors
    assert error.exception_class_path == "tests.test_tasks_backend.GrumpyError"
    assert error.exception_class is GrumpyError
    assert "no coffee" in error.traceback and "raise GrumpyError(message)" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = failed.return_value
    assert done["divide"].errors[0].exception_class is ZeroDivisionError

    # Refreshing an old result object reads the new state; the async API reads the same.
    stale = results["add"]
    stale.refresh()
    assert stale.status == TaskResultStatus.SUCCESSFUL and stale.return_value == 5
    assert asyncio.run(default_task_backend.aget_result(results["add"].id)).return_value == 5

    # The deferred task is still waiting for its time, and the rolled-back one never existed.
    later = result_of(results["later"].id)
    assert later.status == TaskResultStatus.READY and later.task.run_after > timezone.now()
    assert not never.exists() and not (tmp_path / "later").exists()
    assert Run.objects.count() == len(results)
    processes.stop(worker, signal.SIGTERM)


@pytest.mark.django_db
def test_run_after_sets_the_due_time_and_no_worker_takes_the_task_before_then(clock):
    from orchestrator.worker import Worker as WorkerLoop

    due = clock.now() + timedelta(minutes=10)
    result = add.using(run_after=due).enqueue(1, 1)
    task_run = TaskRun.objects.get(pk=result.id)
    assert (task_run.state, task_run.due_at) == (TaskState.SCHEDULED, due)
    worker = WorkerLoop(["default"], concurrency=1)
    worker.register()

    clock.advance(minutes=9, seconds=59)
    assert worker.claim(1, clock.now()) == []
    assert TaskRun.objects.get(pk=task_run.pk).state == TaskState.SCHEDULED
    assert result_of(result.id).status == TaskResultStatus.READY

    clock.advance(1)
    assert [message["id"] for message in worker.claim(1, clock.now())] == [task_run.pk]
    assert TaskRun.objects.get(pk=task_run.pk).state == TaskState.RUNNING
    assert result_of(result.id).status == TaskResultStatus.RUNNING


@pytest.mark.django_db
def test_enqueue_keeps_the_queue_priority_and_arguments():
    result = greet.using(queue_name="mail", priority=-20).enqueue("bob")
    task_run = TaskRun.objects.select_related("run").get(pk=result.id)
    assert (task_run.queue, task_run.priority, task_run.run.trigger) == ("mail", -20, "job")
    assert task_run.spec["ref"] == "tests.test_tasks_backend:greet"
    assert (task_run.spec["args"], task_run.spec["kwargs"]) == (["bob"], {})
    assert (result.task.queue_name, result.task.priority) == ("mail", -20)


@pytest.mark.django_db
def test_a_rolled_back_enqueue_stores_nothing():
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        add.enqueue(1, 2)
        assert Run.objects.count() == 1  # visible inside the transaction
        raise ZeroDivisionError("the caller fails after enqueueing")
    assert not Run.objects.exists() and not TaskRun.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("bad_id", ["", "abc", "-1", "0", "99999999", str(2**80), None, "1.5"])
def test_an_unknown_or_malformed_result_id_does_not_exist(bad_id):
    with pytest.raises(TaskResultDoesNotExist):
        result_of(bad_id)


@pytest.mark.django_db
def test_a_workflow_run_is_not_a_task_result():
    run, _ = create_run(None, trigger="manual", tasks={"t": {"kind": "python", "ref": "workflows.jobs:noop"}})
    with pytest.raises(TaskResultDoesNotExist):
        result_of(TaskRun.objects.get(run=run).pk)


@pytest.mark.django_db
def test_a_plain_function_job_is_readable_as_a_task_result():
    from orchestrator.jobs import enqueue

    run, _ = enqueue("workflows.jobs:send_welcome_email", kwargs={"user_id": 7})
    result = result_of(TaskRun.objects.get(run=run).pk)
    assert result.task.func.__name__ == "send_welcome_email" and result.kwargs == {"user_id": 7}


def test_a_naive_run_after_is_refused_before_anything_is_stored():
    from datetime import datetime

    with pytest.raises(InvalidTask, match="aware"):
        add.using(run_after=datetime(2026, 3, 1, 12, 0))
