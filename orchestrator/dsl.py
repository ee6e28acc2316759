"""The workflow definition API used by modules in ``workflows/``.

    from orchestrator.dsl import Workflow, Param, Schedule

    etl = Workflow("nightly_etl", schedules=[Schedule("30 2 * * *", timezone="Europe/Berlin")],
                   params={"region": Param(str, default="eu")})

    @etl.task(retries=3, timeout=600)
    def extract(ctx): ...

    @etl.task
    def load(ctx): ...

    extract >> load

Nothing here touches the database: a module only describes its workflows, and
``manage.py sync_workflows`` validates and stores them. Mistakes (a bad option value, an
unknown upstream task, a cycle) are collected, not raised, so that sync can report each one
with the workflow, the field and the value.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orchestrator import limits, registry
from orchestrator.states import Catchup, Overlap, TriggerRule

TRIGGER_RULES = tuple(TriggerRule.values)
CATCHUP_POLICIES = tuple(Catchup.values)
OVERLAP_POLICIES = tuple(Overlap.values)
PARAM_TYPES = {str: "str", int: "int", float: "float", bool: "bool", list: "list", dict: "dict", datetime: "datetime"}
PARAM_TYPE_NAMES = ("str", "int", "float", "bool", "date", "datetime", "list", "dict")

_REQUIRED = object()

# While sync imports a module, every Workflow created lands here (see collect()).
_collector: list[Workflow] | None = None


class DefinitionError(Exception):
    """A problem in a workflow definition, naming the workflow, the field and the value."""

    def __init__(self, workflow: str, field: str, value: Any, message: str):
        self.workflow, self.field, self.value, self.message = workflow, field, value, message
        # Values come from user code: quoted bounded, and a failing __repr__ cannot break the report.
        super().__init__(f"workflow {limits.safe_repr(workflow)}: {field}={limits.safe_repr(value)}: {message}")


@dataclass
class TaskContext:
    """What a task function receives as its only argument."""

    run_id: int
    task: str
    logical_date: datetime
    params: dict
    attempt: int
    upstream: dict = field(default_factory=dict)  # parent task name -> its JSON result
    workflow: str = ""
    task_run_id: int = 0


class Param:
    """A declared run parameter: its type, default, choices and description."""

    def __init__(self, type: type | str = str, default: Any = _REQUIRED, *, description: str = "",
                 choices: Iterable | None = None):
        self.type = PARAM_TYPES.get(type, type) if not isinstance(type, str) else type
        self.default = default
        self.description = description
        self.choices = list(choices) if choices is not None else None

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED

    def to_spec(self) -> dict:
        spec = {"type": self.type, "required": self.required, "description": self.description}
        if not self.required:
            spec["default"] = self.default
        if self.choices is not None:
            spec["choices"] = self.choices
        return spec


class Schedule:
    """A cron schedule declared next to its workflow."""

    def __init__(self, cron: str, *, timezone: str = "UTC", name: str | None = None, catchup: str = Catchup.LATEST,
                 max_catchup: int | None = None, overlap: str = Overlap.ALLOW, start_deadline: float | None = None,
                 jitter: int = 0, params: dict | None = None):
        self.cron = cron
        self.timezone = timezone
        self.name = name
        self.catchup = catchup
        self.max_catchup = max_catchup
        self.overlap = overlap
        self.start_deadline = start_deadline
        self.jitter = jitter
        self.params = params or {}

    def to_spec(self) -> dict:
        return {
            "name": self.name, "cron": self.cron, "timezone": self.timezone, "catchup": self.catchup,
            "max_catchup": self.max_catchup, "overlap": self.overlap, "start_deadline": self.start_deadline,
            "jitter": self.jitter, "params": self.params,
        }


class Task:
    """A node of the graph. ``a >> b`` makes b run after a; lists fan out and fan in."""

    def __init__(self, workflow: Workflow, name: str, *, fn: Callable | None = None, command: str | None = None,
                 retries: int = 0, retry_delay: float = 10.0, retry_backoff: float = 2.0,
                 retry_max_delay: float = 3600.0, timeout: float | None = None, queue: str = "default",
                 priority: int = 0, trigger_rule: str = TriggerRule.ALL_SUCCESS, upstream: Iterable[str] = (),
                 env: dict | None = None):
        self.workflow = workflow
        self.name = name
        self.fn = fn
        self.command = command
        self.retries = retries
        self.retry_delay = retry_delay
        self.retry_backoff = retry_backoff
        self.retry_max_delay = retry_max_delay
        self.timeout = timeout
        self.queue = queue
        self.priority = priority
        self.trigger_rule = trigger_rule
        self.upstream_names = list(upstream)
        self.env = env or {}
        if fn is not None:
            self.__doc__ = fn.__doc__
            self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        # The decorated name stays callable as the plain function, e.g. in unit tests.
        return self.fn(*args, **kwargs)

    def __repr__(self):
        return f"<Task {self.workflow.name}.{self.name}>"

    def __rshift__(self, other):
        for child in _as_tasks(other):
            self.workflow._edge(self, child)
        return other

    def __rrshift__(self, other):
        # [a, b] >> c
        for parent in _as_tasks(other):
            self.workflow._edge(parent, self)
        return self

    def __lshift__(self, other):
        for parent in _as_tasks(other):
            self.workflow._edge(parent, self)
        return other

    @property
    def ref(self) -> str:
        return f"{self.fn.__module__}:{self.fn.__qualname__}" if self.fn else ""

    def to_spec(self, upstream: list[str]) -> dict:
        spec = {
            "kind": "python" if self.fn is not None else "shell",
            "max_attempts": self.retries + 1 if isinstance(self.retries, int) else 1,
            "retry_delay": self.retry_delay,
            "retry_backoff": self.retry_backoff,
            "retry_max_delay": self.retry_max_delay,
            "timeout": self.timeout,
            "queue": self.queue,
            "priority": self.priority,
            "trigger_rule": self.trigger_rule,
            "upstream": sorted(upstream),
        }
        if self.fn is not None:
            spec["ref"] = self.ref
        else:
            spec["command"] = self.command
            spec["env"] = self.env
        return spec


def _as_tasks(value) -> list[Task]:
    if isinstance(value, Task):
        return [value]
    if isinstance(value, list | tuple | set):
        items = list(value)
        if all(isinstance(item, Task) for item in items):
            return items
    raise TypeError(f"a dependency must be a task or a list of tasks, got {value!r}")


class Workflow:
    """A DAG of tasks with its schedules, params and options."""

    def __init__(self, name: str, *, description: str = "", schedules: Iterable[Schedule] = (),
                 schedule: str | Schedule | None = None, timezone: str = "UTC",
                 params: dict[str, Param | Any] | None = None, tags: Iterable[str] = (), owner: str = "",
                 tenant: str = "default", max_active_runs: int | None = None, webhooks: Iterable[str] = (),
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
        self.tasks: dict[str, Task] = {}
        self.edges: list[tuple[str, str]] = []
        self.errors: list[DefinitionError] = []
        if module is None:
            frame = inspect.currentframe().f_back
            module = frame.f_globals.get("__name__", "") if frame else ""
        self.module = module
        if _collector is not None:
            _collector.append(self)

    def __repr__(self):
        return f"<Workflow {self.name}>"

    def _error(self, field_name: str, value: Any, message: str) -> None:
        self.errors.append(DefinitionError(self.name, field_name, value, message))

    def _add(self, task: Task) -> Task:
        if task.name in self.tasks:
            self._error(f"tasks.{task.name}", task.name, "duplicate task name: two tasks are called this")
        else:
            self.tasks[task.name] = task
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

    def task(self, fn: Callable | None = None, /, *, name: str | None = None, **options):
        """Decorator: ``@wf.task`` or ``@wf.task(retries=3, timeout=60, queue="batch")``."""

        def register(func: Callable) -> Task:
            return self._add(Task(self, name or func.__name__, fn=func, **options))

        return register(fn) if fn is not None else register

    def shell(self, name: str, command: str, **options) -> Task:
        """A task that runs a shell command; the run's params are in its environment."""
        return self._add(Task(self, name, command=command, **options))

    def upstream_of(self) -> dict[str, set[str]]:
        upstream = {name: set() for name in self.tasks}
        for parent, child in self.edges:
            upstream[child].add(parent)
        for task in self.tasks.values():
            upstream[task.name].update(task.upstream_names)
        return upstream

    def to_spec(self) -> dict:
        upstream = self.upstream_of()
        return {
            "name": self.name,
            "description": self.description,
            "tags": self.tags,
            "owner": self.owner,
            "tenant": self.tenant,
            "max_active_runs": self.max_active_runs,
            "webhooks": self.webhooks,
            "params": {key: param.to_spec() for key, param in self.params.items()},
            "tasks": {name: task.to_spec(sorted(upstream[name])) for name, task in self.tasks.items()},
        }


def collect(importer: Callable[[], Any]) -> list[Workflow]:
    """Run ``importer`` (which imports a module) and return the workflows it created."""
    global _collector
    previous, _collector = _collector, []
    try:
        importer()
        return list(_collector)
    finally:
        _collector = previous
