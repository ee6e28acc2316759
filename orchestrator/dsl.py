"""The workflow definition API used by modules in ``workflows/``.

    from orchestrator.dsl import Workflow, Param, Schedule

    etl = Workflow("nightly_etl", schedules=[Schedule("30 2 * * *", timezone="Europe/Berlin")],
                   params={"region": Param(str, default="eu")})

    @etl.task(retries=3, timeout=600)
    def extract(ctx): ...

    @etl.task
    def load(ctx): ...

    extract >> load

Beyond a fixed graph: ``task.map(over=parent)`` fans out over a parent's list result,
``@wf.branch`` chooses which children to follow, ``@wf.sensor(every=60, timeout=3600)`` waits
without holding a worker, ``produces=[...]`` and ``triggers=[On(...)]`` start workflows from
other workflows' data, ``on_failure``/``on_success``/``on_retry`` call functions as jobs, and
``wf.test()`` runs a whole workflow in the calling process. ``with wf.group("extract"):`` puts
the tasks defined inside in a group, folded to one row of the grid and one node of the graph
(``orchestrator.definition.TaskGroup`` says why their names stay unprefixed).

Nothing here touches the database: a module only describes its workflows, and
``manage.py sync_workflows`` validates and stores them. Mistakes (a bad option value, an
unknown upstream task, a cycle) are collected, not raised, so that sync can report each one
with the workflow, the field and the value.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from orchestrator import registry
from orchestrator.definition import (
    CALLBACK_EVENTS,
    CATCHUP_POLICIES,
    NOTIFY_EVENTS,
    OVERLAP_POLICIES,
    PARAM_TYPE_NAMES,
    PARAM_TYPES,
    TRIGGER_MODES,
    TRIGGER_RULES,
    DefinitionError,
    Notify,
    On,
    Param,
    Schedule,
    Task,
    TaskGroup,
    callback_ref,
    callback_refs,
    register_callbacks,
)
from orchestrator.taskcontext import TaskContext

# The parts of a definition are importable from here too: workflow modules need only this module.
__all__ = ["CALLBACK_EVENTS", "CATCHUP_POLICIES", "NOTIFY_EVENTS", "OVERLAP_POLICIES", "PARAM_TYPES", "PARAM_TYPE_NAMES",
           "TRIGGER_MODES", "TRIGGER_RULES", "DefinitionError", "Notify", "On", "Param", "Schedule", "Task", "TaskContext",
           "TaskGroup", "Workflow", "callback_ref", "collect"]

# While a module is imported through collect(), every Workflow created in that thread lands in this
# thread's list: sync imports each module in a child process of its own (orchestrator.discovery),
# and an import in another thread of the same process (a worker's reload) adds to no other's.
_collecting = threading.local()


class Workflow:
    """A DAG of tasks with its schedules, params and options."""

    def __init__(self, name: str, *, description: str = "", schedules: Iterable[Schedule] = (),
                 schedule: str | Schedule | None = None, timezone: str = "UTC",
                 params: dict[str, Param | Any] | None = None, tags: Iterable[str] = (), owner: str = "",
                 tenant: str = "default", max_active_runs: int | None = None, webhooks: Iterable[str] = (),
                 triggers: Iterable[On] = (), on_failure=None, on_success=None, on_retry=None,
                 deadline: float | None = None, run_timeout: float | None = None, notify: Iterable[Notify] = (),
                 secrets: Iterable[str] | dict | None = None, connections: Iterable[str] | dict | None = None,
                 module: str | None = None):
        self.name = name
        self.description = inspect.cleandoc(description) if description else ""
        self.schedules = list(schedules)
        if schedule is not None:
            self.schedules.insert(0, schedule if isinstance(schedule, Schedule) else Schedule(schedule, timezone=timezone))
        self.params = {key: value if isinstance(value, Param) else Param(type(value), default=value)
                       for key, value in (params or {}).items()}
        self.tags = list(tags)
        self.owner = owner
        self.tenant = tenant
        self.max_active_runs = max_active_runs
        self.webhooks = list(webhooks)
        self.triggers = [triggers] if isinstance(triggers, On) else list(triggers)
        # on_failure/on_success: the run ended so; on_retry: any of its tasks will be retried.
        self.callbacks = {"on_failure": on_failure, "on_success": on_success, "on_retry": on_retry}
        register_callbacks(self.callbacks)
        self.deadline = deadline  # seconds after the logical date; a later run is recorded as late
        self.run_timeout = run_timeout  # seconds after a run starts; it then fails, its tasks cancelled
        # Who hears of this workflow's runs: emails and chat posts (orchestrator.notifications).
        self.notify = [notify] if isinstance(notify, Notify) else list(notify)
        # The secrets and connections every task of the workflow may read (orchestrator.secrets).
        self.secrets = secrets
        self.connections = connections
        self.tasks: dict[str, Task] = {}
        self.edges: list[tuple[str, str]] = []
        self.errors: list[DefinitionError] = []
        self.groups: list[TaskGroup] = []  # in the order they were opened, nested ones too
        self._open_groups: list[TaskGroup] = []  # the ``with wf.group()`` blocks being defined
        if module is None:
            frame = inspect.currentframe().f_back
            module = frame.f_globals.get("__name__", "") if frame else ""
        self.module = module
        collector = getattr(_collecting, "workflows", None)
        if collector is not None:
            collector.append(self)

    def __repr__(self):
        return f"<Workflow {self.name}>"

    def _error(self, field_name: str, value: Any, message: str) -> None:
        self.errors.append(DefinitionError(self.name, field_name, value, message))

    def _add(self, task: Task) -> Task:
        if task.name in self.tasks:
            self._error(f"tasks.{task.name}", task.name, "duplicate task name: two tasks are called this")
        else:
            self.tasks[task.name] = task
            if self._open_groups:
                task.group = self._open_groups[-1]
                task.group.tasks.append(task)
            if task.fn is not None:
                # A workflow's Python tasks are registered functions: a worker runs them by reference.
                registry.register(task, task.ref)
        return task

    def _edge(self, parent: Task, child: Task) -> None:
        for node in (parent, child):
            if node.workflow is not self:
                self._error(f"tasks.{node.name}", node.name,
                            f"unknown task: it belongs to workflow {node.workflow.name!r}")
                return
        self.edges.append((parent.name, child.name))

    def group(self, name: str, *, tooltip: str = "") -> TaskGroup:
        """``with wf.group("extract", tooltip="..."):``: the tasks defined inside belong to the
        group (to the innermost one, when groups nest). ``tooltip`` is shown on its row and node."""
        group = TaskGroup(self, name, tooltip=tooltip, parent=self._open_groups[-1] if self._open_groups else None)
        self.groups.append(group)
        return group

    def task(self, fn: Callable | None = None, /, *, name: str | None = None, **options):
        """Decorator: ``@wf.task`` or ``@wf.task(retries=3, timeout=60, queue="batch")``."""

        def register(func: Callable) -> Task:
            return self._add(Task(self, name or func.__name__, fn=func, **options))

        return register(fn) if fn is not None else register

    def shell(self, name: str, command: str, **options) -> Task:
        """A task that runs a shell command; the run's params are in its environment."""
        return self._add(Task(self, name, command=command, **options))

    def branch(self, fn: Callable | None = None, /, **options):
        """Decorator: a task that returns the name (or list of names) of the children to follow;
        the other children are skipped, and their descendants follow their trigger rules."""
        return self.task(fn, branch=True, **options) if fn is not None else self.task(branch=True, **options)

    def sensor(self, fn: Callable | None = None, /, *, every: float = 60, timeout: float | None = 3600,
               poke_timeout: float | None = 60, **options):
        """Decorator: a check run every ``every`` seconds until it returns a true value (which
        becomes its result). Between checks it holds no worker; after ``timeout`` seconds of
        false answers the attempt fails as timed out (and retries by ``retries``).
        ``poke_timeout`` kills one check that hangs."""
        sensor = {"every": every, "timeout": timeout}
        options = {"timeout": poke_timeout, "sensor": sensor, **options}
        return self.task(fn, **options) if fn is not None else self.task(**options)

    def approval(self, name: str, *, ask: str, options: Iterable[str] = ("approve", "reject"),
                 reject: Iterable[str] | None = None, form: dict | None = None, timeout: float | None = None,
                 groups: Iterable[str] = (), **options_):
        """A task that asks a person and waits for the answer, holding no worker: ``ask`` is the
        question (``{params[amount]}``, ``{upstream[task]}``, ``{run_id}`` and ``{logical_date}``
        are filled in), ``options`` the answers, ``reject`` those that fail the task (by default
        "reject" when it is an option), ``form`` more fields to fill in (``Param``s), ``timeout``
        how long to wait (then the retry rule: ``retries`` asks again), ``groups`` who may
        answer besides operators. The result, for the tasks downstream, is ``{"answer": ...,
        "form": {...}, "by": ..., "at": ...}``."""
        options = [options] if isinstance(options, str) else list(options)
        if reject is None:
            reject = [option for option in options if option == "reject"]
        approval = {"ask": ask, "options": options, "reject": [reject] if isinstance(reject, str) else list(reject),
                    "form": dict(form or {}), "timeout": timeout,
                    "groups": [groups] if isinstance(groups, str) else list(groups)}
        return self._add(Task(self, name, approval=approval, **options_))

    def upstream_of(self) -> dict[str, set[str]]:
        upstream = {name: set() for name in self.tasks}
        for parent, child in self.edges:
            upstream[child].add(parent)
        for task in self.tasks.values():
            upstream[task.name].update(task.upstream_names)
        return upstream

    def children_of(self) -> dict[str, set[str]]:
        children = {name: set() for name in self.tasks}
        for child, parents in self.upstream_of().items():
            for parent in parents:
                if parent in children:
                    children[parent].add(child)
        return children

    def to_spec(self) -> dict:
        upstream = self.upstream_of()
        children = self.children_of()
        mapped_by: dict[str, set[str]] = {}
        for task in self.tasks.values():
            if task.map_over is not None:
                mapped_by.setdefault(task.map_over.name, set()).add(task.name)
        spec = {
            "name": self.name,
            "description": self.description,
            "tags": self.tags,
            "owner": self.owner,
            "tenant": self.tenant,
            "max_active_runs": self.max_active_runs,
            "webhooks": self.webhooks,
            "params": {key: param.to_spec() for key, param in self.params.items()},
            "tasks": {name: task.to_spec(sorted(upstream[name]), children[name], mapped_by.get(name, ()))
                      for name, task in self.tasks.items()},
        }
        # The workflow's on_retry applies to each of its tasks (a run is never retried as such).
        retry_refs = callback_refs({"on_retry": self.callbacks.get("on_retry")}).get("on_retry", [])
        for task_spec in spec["tasks"].values() if retry_refs else ():
            task_callbacks = task_spec.setdefault("callbacks", {})
            task_callbacks["on_retry"] = task_callbacks.get("on_retry", []) + retry_refs
        # PostgreSQL's jsonb keeps no key order, so the trigger form would lose the declared order
        # of the params; it is kept as a list. Written only when it is not the alphabetical order
        # the form falls back on, so existing graphs keep their hash.
        if list(self.params) != sorted(self.params):
            spec["param_order"] = list(self.params)
        # As in Task.to_spec: written only when used, so existing graphs keep their hash.
        if self.triggers:
            spec["triggers"] = [on.to_spec() for on in self.triggers]
        callbacks = callback_refs(self.callbacks)
        if callbacks:
            spec["callbacks"] = callbacks
        if self.deadline is not None:
            spec["deadline"] = self.deadline
        if self.run_timeout is not None:
            spec["run_timeout"] = self.run_timeout
        if self.notify:
            spec["notify"] = [rule.to_spec() for rule in self.notify]
        if self.groups:
            spec["groups"] = {group.name: group.to_spec() for group in self.groups}
        return spec

    def test(self, params: dict | None = None, logical_date: datetime | None = None, **options):
        """Run the whole workflow in this process and return each task's state and result
        (see ``orchestrator.localrun``): for a project's own unit tests."""
        # Imported here, not at the top: a local run needs Django's models, and workflow modules
        # import this module before the app registry is ready (or without Django at all).
        from orchestrator.localrun import run_workflow  # noqa: PLC0415 - see the comment above

        return run_workflow(self, params=params, logical_date=logical_date, **options)


def collect(importer: Callable[[], Any]) -> list[Workflow]:
    """Run ``importer`` (which imports a module) and return the workflows it created in this thread."""
    previous = getattr(_collecting, "workflows", None)
    _collecting.workflows = []
    try:
        importer()
        return list(_collecting.workflows)
    finally:
        _collecting.workflows = previous
