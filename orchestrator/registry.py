"""The functions that may run as jobs: registered by the project's own code, never named freely.

Operators choose when work runs, never which code: the API, the admin and the workers accept a
reference (``package.module:function``) only when it names something the project registered:

- a function decorated with ``@job`` (``from orchestrator.jobs import job``);
- a ``django.tasks`` ``@task`` of this backend (registered when the task is defined);
- a task of a workflow, or a callback of a workflow or task (registered when its module is
  imported, and stored by sync in the workflow's graph version).

Where registrations come from: at start-up every process imports the modules named in
``ORCHESTRATOR_JOB_MODULES`` and the ``jobs`` and ``tasks`` modules of every installed app (as
the admin discovers ``admin.py``). Nothing else is ever imported because a request, a form or a
database row named it: the web process checks a reference against this registry and against the
graph versions sync stored, and a worker refuses a task run whose reference or shell command
nothing registered, however the row was written.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.utils.module_loading import autodiscover_modules

from orchestrator import limits
from orchestrator.conf import app_settings

# ref -> the registered object (a function, a django.tasks Task or a workflow's Task).
_registered: dict[str, object] = {}

# The job modules autodiscover() imported, in order (a fresh worker child imports them again when
# the code on disk changed: see orchestrator.reload).
job_modules: list[str] = []

# Modules of the orchestrator itself that define jobs (webhook deliveries and notification
# messages, the question of an approval task).
BUILTIN_MODULES = ("orchestrator.notifier", "orchestrator.approvals")
APP_MODULES = ("jobs", "tasks")


class NotRegistered(LookupError):
    """A reference nothing registered; the message says how to register it."""


def ref_of(obj) -> str:
    """``module:qualname`` of a function, a django.tasks Task or a workflow Task."""
    fn = getattr(obj, "func", None) or getattr(obj, "fn", None) or obj
    return f"{fn.__module__}:{fn.__qualname__}"


def register(obj, ref: str | None = None) -> str:
    """Register ``obj`` under ``ref`` (its own ``module:qualname`` by default); returns the ref."""
    ref = ref or ref_of(obj)
    existing = _registered.get(ref)
    # Task.using() makes a copy of a django.tasks Task, which registers again: keep the original.
    if existing is not None and getattr(existing, "func", None) is not None and \
            getattr(existing, "func", None) is getattr(obj, "func", None):
        return ref
    _registered[ref] = obj
    return ref


# Where a job runs (``@job(executor=...)``): "process", a forked child of the worker (the
# default: killable, so its timeout holds), "async", an ``async def`` on the worker's event loop
# process beside hundreds of others, or "thread", a plain function in that process's thread pool
# (see orchestrator.worker.inprocess).
EXECUTORS = ("process", "async", "thread")

# ref -> the executor a job declared, for those that declared one other than "process".
_executors: dict[str, str] = {}


def job(fn=None, /, *, executor: str = "process"):
    """Decorator: ``@job`` lets the API, the admin and ``enqueue()`` run this function as a job.

    The function stays a plain function. Its module must be imported by every process that
    enqueues or runs it: put it in a ``jobs`` module of an installed app, or name its module in
    ``ORCHESTRATOR_JOB_MODULES``. ``executor`` says where a worker runs it: "process" (a forked
    child, the default), "async" (an ``async def``, on the event loop of the worker's in-process
    executor) or "thread" (a plain function, in its thread pool)."""
    if executor not in EXECUTORS:
        raise TypeError(f"@job(executor=...) must be one of {', '.join(map(repr, EXECUTORS))}, "
                        f"got {limits.safe_repr(executor)}")

    def decorate(func):
        if not callable(func):
            raise TypeError(f"@job decorates a function, not {limits.safe_repr(func)}")
        is_async = inspect.iscoroutinefunction(func)
        if executor == "async" and not is_async:
            raise TypeError(f"@job(executor='async') needs an 'async def' function; {ref_of(func)} is a plain "
                            "function (use executor='thread' for blocking I/O, or make it 'async def')")
        if executor == "thread" and is_async:
            raise TypeError(f"@job(executor='thread') runs a plain function in a thread; {ref_of(func)} is "
                            "'async def' (use executor='async')")
        ref = register(func)
        if executor == "process":
            _executors.pop(ref, None)
        else:
            _executors[ref] = executor
        return func

    return decorate(fn) if fn is not None else decorate


def in_process_refs() -> list[str]:
    """The registered jobs declared for the in-process executor (async or thread)."""
    return sorted(_executors)


def executor_of(ref: str) -> str:
    """Where a worker runs the job registered under ``ref``: "process", "async" or "thread"."""
    return _executors.get(ref, "process")


def get(ref: str):
    """The object registered under ``ref`` in this process, or None. Never imports."""
    return _registered.get(ref) if isinstance(ref, str) else None


def registered_refs() -> list[str]:
    return sorted(_registered)


def registered_in(module: str) -> dict[str, object]:
    """The registrations of the functions of one module (to put back with ``restore``)."""
    return {ref: obj for ref, obj in _registered.items() if ref.partition(":")[0] == module}


def forget_module(module: str) -> None:
    for ref in registered_in(module):
        del _registered[ref]


def restore(registrations: dict[str, object]) -> None:
    _registered.update(registrations)


def check_syntax(ref) -> str:
    if not isinstance(ref, str) or len(ref) > limits.MAX_REF_LENGTH or not limits.REF_RE.match(ref):
        raise NotRegistered(f"ref {limits.safe_repr(ref)} {limits.REF_RULE} "
                            f"(at most {limits.MAX_REF_LENGTH} characters)")
    return ref


def unknown(ref: str) -> NotRegistered:
    return NotRegistered(
        f"unknown job {ref!r}: only functions the project registered can run (decorated with @job, "
        "a django.tasks @task, or a workflow's task); register it in a jobs module of an installed app "
        "or a module named in ORCHESTRATOR_JOB_MODULES"
    )


# --- what sync stored ---------------------------------------------------------------------------

# Whether the current graph version of a workflow declares this ref as a Python task. Only sync
# writes graph versions, from the project's workflow modules, so such a ref is the project's code.
WORKFLOW_TASK_REF = """
SELECT EXISTS (
    SELECT 1 FROM orchestrator_workflow w JOIN orchestrator_workflowversion v ON v.id = w.current_version_id
    WHERE w.present AND jsonb_path_exists(v.spec, '$.tasks.*.ref ? (@ == $ref)', jsonb_build_object('ref', %(ref)s::text))
)
"""

# The same for a callback (on_failure/on_success/on_retry) of a workflow or of one of its tasks:
# callbacks run as jobs, and their functions are the project's code that sync stored by reference.
WORKFLOW_CALLBACK_REF = """
SELECT EXISTS (
    SELECT 1 FROM orchestrator_workflow w JOIN orchestrator_workflowversion v ON v.id = w.current_version_id
    WHERE w.present AND (
        jsonb_path_exists(v.spec, '$.callbacks.*[*] ? (@ == $ref)', jsonb_build_object('ref', %(ref)s::text))
        OR jsonb_path_exists(v.spec, '$.tasks.*.callbacks.*[*] ? (@ == $ref)', jsonb_build_object('ref', %(ref)s::text)))
)
"""

# What the graph version of a task run's run declares for that task (NULL for a job): a worker
# runs a workflow task's shell command or imports its module only if sync stored it so.
DECLARED_TASK = """
SELECT v.spec->'tasks'->t.task
FROM orchestrator_taskrun t
JOIN orchestrator_run r ON r.id = t.run_id
JOIN orchestrator_workflowversion v ON v.id = r.version_id
WHERE t.id = %(task_run)s
"""


def is_workflow_task(ref: str) -> bool:

    with connection.cursor() as cursor:
        cursor.execute(WORKFLOW_TASK_REF, {"ref": ref})
        return bool(cursor.fetchone()[0])


def is_workflow_callback(ref: str) -> bool:

    with connection.cursor() as cursor:
        cursor.execute(WORKFLOW_CALLBACK_REF, {"ref": ref})
        return bool(cursor.fetchone()[0])


def declared_task(task_run_id: int) -> dict | None:
    """The task's spec in its run's graph version, or None (a job, or no version)."""


    with connection.cursor() as cursor:
        cursor.execute(DECLARED_TASK, {"task_run": task_run_id})
        row = cursor.fetchone()
    value = row[0] if row else None
    return json.loads(value) if isinstance(value, str) else value


def check_enqueue(ref) -> str:
    """Raise NotRegistered unless ``ref`` may be enqueued by name: registered in this process,
    or a task of a stored workflow. Imports nothing."""
    check_syntax(ref)
    if get(ref) is None and not is_workflow_task(ref):
        raise unknown(ref)
    return ref


def load_for_worker(ref: str, task_run_id: int, *, declared: dict | None = None):
    """The object a worker's child runs for ``ref``. A ref registered at start-up is taken as it
    is; a workflow task's module is imported only when a stored graph version declares the ref
    (this task run's own, or a workflow's current one for a job naming a workflow task), and
    the ref must then be registered by that import."""
    check_syntax(ref)
    found = get(ref)
    if found is not None:
        return found
    declared = declared_task(task_run_id) if declared is None else declared
    if (declared or {}).get("ref") == ref or is_workflow_task(ref) or is_workflow_callback(ref):
        importlib.import_module(ref.partition(":")[0])
        found = get(ref)
    if found is None:
        raise unknown(ref)
    return found


def autodiscover() -> None:
    """Import the job modules: the built-in ones, ORCHESTRATOR_JOB_MODULES, and each installed
    app's ``jobs`` and ``tasks`` modules. A module named in the setting that cannot be imported
    is a configuration error and stops the process, as a broken ``admin.py`` does."""


    for name in BUILTIN_MODULES:
        importlib.import_module(name)
    imported = []
    for name in app_settings.JOB_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"ORCHESTRATOR_JOB_MODULES names {name!r}, which cannot be imported: {exc}") from exc
        imported.append(name)
    autodiscover_modules(*APP_MODULES)
    imported += [f"{config.name}.{name}" for config in apps.get_app_configs() for name in APP_MODULES
                 if f"{config.name}.{name}" in sys.modules]
    job_modules[:] = list(dict.fromkeys(imported))
