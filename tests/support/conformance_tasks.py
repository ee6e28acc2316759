"""django.tasks tasks for the backend conformance suite (tests/test_tasks_conformance.py). The
workers import this module (ORCHESTRATOR_JOB_MODULES), so it also records, in the file named by
CONFORMANCE_SIGNALS, every task signal the worker's process sends."""

import asyncio
import json
import os
import sys

from django.contrib.auth.models import Group
from django.db import transaction
from django.tasks import TaskContext, task
from django.tasks.signals import task_enqueued, task_finished, task_started


class ShopError(Exception):
    """An exception class of the project's own, so its dotted path is not a builtin's."""


def _record(name, sender, task_result, **kwargs):
    path = os.environ.get("CONFORMANCE_SIGNALS")
    if not path:
        return
    exc = sys.exc_info()[1]
    with open(path, "a") as handle:  # O_APPEND: one short line per write never interleaves
        handle.write(json.dumps({
            "signal": name, "sender": f"{sender.__module__}.{sender.__qualname__}", "pid": os.getpid(),
            "id": task_result.id, "status": str(task_result.status), "path": task_result.task.module_path,
            "workers": task_result.worker_ids, "errors": [e.exception_class_path for e in task_result.errors],
            "handling": type(exc).__name__ if exc else None,
            "started_at": task_result.started_at.isoformat() if task_result.started_at else None,
            "finished_at": task_result.finished_at.isoformat() if task_result.finished_at else None,
        }) + "\n")


for _name, _signal in (("enqueued", task_enqueued), ("started", task_started), ("finished", task_finished)):
    _signal.connect(lambda sender, task_result, _n=_name, **kw: _record(_n, sender, task_result, **kw),
                    weak=False, dispatch_uid=f"conformance-{_name}")


@task
def noop(*args, **kwargs):
    return None


@task
async def noop_async(*args, **kwargs):
    await asyncio.sleep(0)


@task(priority=10)
def meaning_of_life():
    return 42


@task
def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}


@task
def raises_value_error():
    raise ValueError("This task failed due to ValueError")


@task
def raises_nested():
    raise ValueError(ValueError("This task failed"))


@task
def raises_multiline():
    raise ShopError("first line\nsecond line: with a colon\nDETAIL: not a class name")


@task
def violates_a_constraint():
    # PostgreSQL's message for a duplicate key ends in a "DETAIL:" line.
    with transaction.atomic():
        Group.objects.create(name="conformance-duplicate")
        Group.objects.create(name="conformance-duplicate")


@task
def raises_system_exit():
    raise SystemExit("This task failed due to SystemExit")


@task
def raises_keyboard_interrupt():
    raise KeyboardInterrupt("This task failed due to KeyboardInterrupt")


@task
def calls_exit():
    exit(1)


@task
def returns_a_function():
    return lambda: True


@task
def returns_nan():
    return float("nan")


@task(takes_context=True)
def about_itself(context):
    assert isinstance(context, TaskContext)
    result = context.task_result
    return {"id": result.id, "attempt": context.attempt, "status": str(result.status),
            "workers": result.worker_ids, "started": result.started_at is not None}


@task
def sleep_for(seconds):
    import time

    time.sleep(seconds)
    return seconds


@task
def ready_marker(path):
    with open(path, "a") as handle:
        handle.write(f"{os.getpid()}\n")
    return path
