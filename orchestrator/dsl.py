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
``wf.test()`` runs a whole workflow in the calling process.

Nothing here touches the database: a module only describes its workflows, and
``manage.py sync_workflows`` validates and stores them. Mistakes (a bad option value, an
unknown upstream task, a cycle) are collected, not raised, so that sync can report each one
with the workflow, the field and the value.
"""

from __future__ import annotations

import inspect
import threading
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
TRIGGER_MODES = ("any", "all")
CALLBACK_EVENTS = ("on_failure", "on_success", "on_retry")

_REQUIRED = object()

# While sync imports a module, every Workflow created in that thread lands in this thread's list
# (see collect()): an import sync gave up on, still running in its own thread, adds to no other's.
_collecting = threading.local()


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
    # A mapped task's instance: its position in the parent's list and the item itself.
    map_index: int | None = None
    item: Any = None
    # The dataset events that started this run (data-triggered runs), oldest first: each a dict
    # with dataset, logical_date, metadata, workflow, run_id and task of the producer.
    events: list = field(default_factory=list)
    # Metadata for the events this task produces: ``ctx.metadata["sales_daily"] = {"rows": 10}``.
    metadata: dict = field(default_factory=dict)


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
                 env: dict | None = None, branch: bool = False, produces: Iterable[str] = (),
                 on_failure: Callable | Iterable[Callable] | None = None,
                 on_success: Callable | Iterable[Callable] | None = None,
                 on_retry: Callable | Iterable[Callable] | None = None, sensor: dict | None = None):
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
        self.branch = branch
        self.produces = [produces] if isinstance(produces, str) else list(produces)
        self.callbacks = {"on_failure": on_failure, "on_success": on_success, "on_retry": on_retry}
        _register_callbacks(self.callbacks)
        self.sensor = sensor  # {"every": seconds, "timeout": seconds or None}
        self.map_over: Task | None = None
        self.max_parallel: int | None = None
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

    def map(self, over: Task, *, max_parallel: int | None = None) -> Task:
        """Run this task once per item of ``over``'s result (a list), when ``over`` succeeds:
        each instance gets ``ctx.item`` and ``ctx.map_index``; its children get the list of the
        instances' results, in order. ``max_parallel`` caps how many instances run at once."""
        if not isinstance(over, Task):
            self.workflow._error(f"tasks.{self.name}.map", over, "map(over=...) takes a task of the same workflow")
            return self
        if self.map_over is not None:
            self.workflow._error(f"tasks.{self.name}.map", over.name, "a task can be mapped only once")
            return self
        self.map_over = over
        self.max_parallel = max_parallel
        self.workflow._edge(over, self)
        return self

    @property
    def ref(self) -> str:
        return f"{self.fn.__module__}:{self.fn.__qualname__}" if self.fn else ""

    def to_spec(self, upstream: list[str], children: Iterable[str] = (), mapped_by: Iterable[str] = ()) -> dict:
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
        # The options below are written only when used, so a graph that uses none of them keeps
        # the hash (and version) it had before they existed.
        if self.map_over is not None:
            spec["map_over"] = self.map_over.name
            if self.max_parallel is not None:
                spec["max_parallel"] = self.max_parallel
        if mapped_by:
            # The worker checks this task's result can be mapped (a list, within the item limit).
            spec["mapped_by"] = sorted(mapped_by)
        if self.branch:
            spec["branch"] = True
            spec["children"] = sorted(children)
        if self.sensor is not None:
            spec["sensor"] = dict(self.sensor)
        if self.produces:
            spec["produces"] = sorted(set(self.produces))
        callbacks = callback_refs(self.callbacks)
        if callbacks:
            spec["callbacks"] = callbacks
        return spec


class On:
    """A data trigger: ``On("sales_daily")`` starts a run for each new event of the dataset;
    ``On("a", "b")`` for each event of either; ``On("a", "b", mode="all")`` once each of them
    has a new event since the last run this trigger started."""

    def __init__(self, *datasets: str, mode: str = "any"):
        self.datasets = list(datasets)
        self.mode = mode

    def __repr__(self):
        return f"On({', '.join(map(repr, self.datasets))}, mode={self.mode!r})"

    def to_spec(self) -> dict:
        return {"datasets": sorted(set(self.datasets), key=str), "mode": self.mode}


def _callables(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def callback_ref(fn) -> str:
    """A callback's "module:qualname" (what a job names), or "" when it has none."""
    if not inspect.isfunction(fn):  # a plain function (not a task, a builtin or a bound method)
        return ""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    return f"{module}:{qualname}" if module and qualname else ""


def _register_callbacks(callbacks: dict) -> None:
    # A callback runs as a job on a worker, which runs registered functions only.
    for value in callbacks.values():
        for fn in _callables(value):
            ref = callback_ref(fn)
            if ref:
                registry.register(fn, ref)


def callback_refs(callbacks: dict) -> dict[str, list[str]]:
    return {event: [callback_ref(fn) for fn in _callables(value)]
            for event, value in sorted(callbacks.items()) if _callables(value)}


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
                 triggers: Iterable[On] = (), on_failure=None, on_success=None, on_retry=None,
                 deadline: float | None = None, run_timeout: float | None = None, module: str | None = None):
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
        _register_callbacks(self.callbacks)
        self.deadline = deadline  # seconds after the logical date; a later run is recorded as late
        self.run_timeout = run_timeout  # seconds after a run starts; it is then cancelled
        self.tasks: dict[str, Task] = {}
        self.edges: list[tuple[str, str]] = []
        self.errors: list[DefinitionError] = []
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
        return spec

    def test(self, params: dict | None = None, logical_date: datetime | None = None, **options):
        """Run the whole workflow in this process and return each task's state and result
        (see ``orchestrator.localrun``): for a project's own unit tests."""
        from orchestrator.localrun import run_workflow

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
