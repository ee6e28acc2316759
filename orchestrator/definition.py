"""The parts a workflow definition is made of: tasks, task groups, params, schedules and data
triggers, the names of their options' values, and the error that names what is wrong in a definition.
``orchestrator.dsl`` puts them together in ``Workflow``, the API that workflow modules import;
``orchestrator.validation`` checks them.

Nothing here touches the database, and nothing here imports Django's models: workflow modules
import it before (and without) the app registry.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from orchestrator import limits, registry, secrets
from orchestrator.retries import DEFAULT as DEFAULT_RETRY
from orchestrator.retries import RetryPolicy
from orchestrator.states import Catchup, Overlap, TriggerRule

TRIGGER_RULES = tuple(TriggerRule.values)
CATCHUP_POLICIES = tuple(Catchup.values)
OVERLAP_POLICIES = tuple(Overlap.values)
PARAM_TYPES = {str: "str", int: "int", float: "float", bool: "bool", list: "list", dict: "dict", datetime: "datetime"}
PARAM_TYPE_NAMES = ("str", "int", "float", "bool", "date", "datetime", "list", "dict")
TRIGGER_MODES = ("any", "all")
CALLBACK_EVENTS = ("on_failure", "on_success", "on_retry")
# The function a worker runs for an approval task: it asks the question (orchestrator.approvals).
APPROVAL_REF = "orchestrator.approvals:ask"
# What a notification rule can be about (``Notify(on=[...])`` and the admin's rules).
NOTIFY_EVENTS = ("run_failed", "run_succeeded", "deadline_missed", "sensor_timed_out", "approval_requested")

_REQUIRED = object()


class DefinitionError(Exception):
    """A problem in a workflow definition, naming the workflow, the field and the value."""

    def __init__(self, workflow: str, field: str, value: Any, message: str):
        self.workflow, self.field, self.value, self.message = workflow, field, value, message
        # Values come from user code: quoted bounded, and a failing __repr__ cannot break the report.
        super().__init__(f"workflow {limits.safe_repr(workflow)}: {field}={limits.safe_repr(value)}: {message}")


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
    """A node of the graph of ``workflow`` (an ``orchestrator.dsl.Workflow``). ``a >> b`` makes b run
    after a; lists fan out and fan in."""

    def __init__(self, workflow, name: str, *, fn: Callable | None = None, command: str | None = None,
                 retries: int = DEFAULT_RETRY.max_attempts - 1, retry_delay: float = DEFAULT_RETRY.delay,
                 retry_backoff: float = DEFAULT_RETRY.backoff, retry_max_delay: float = DEFAULT_RETRY.max_delay, timeout: float | None = None, queue: str = "default",
                 priority: int = 0, trigger_rule: str = TriggerRule.ALL_SUCCESS, upstream: Iterable[str] = (),
                 env: dict | None = None, branch: bool = False, produces: Iterable[str] = (),
                 on_failure: Callable | Iterable[Callable] | None = None,
                 on_success: Callable | Iterable[Callable] | None = None,
                 on_retry: Callable | Iterable[Callable] | None = None, sensor: dict | None = None,
                 approval: dict | None = None, secrets: Iterable[str] | dict | None = None,
                 connections: Iterable[str] | dict | None = None):
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
        register_callbacks(self.callbacks)
        self.sensor = sensor  # {"every": seconds, "timeout": seconds or None}
        # {"ask": text, "options": [...], "reject": [...], "form": {name: Param}, "timeout": seconds, "groups": [...]}
        self.approval = approval
        # What the task may read (besides what its workflow declares): names, or for a shell task
        # {environment variable: name} (orchestrator.secrets).
        self.secrets = secrets
        self.connections = connections
        self.map_over: Task | None = None
        self.max_parallel: int | None = None
        self.group: TaskGroup | None = None  # set by the workflow: the innermost ``with wf.group()``
        if fn is not None:
            self.__doc__ = fn.__doc__
            self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        # The decorated name stays callable as the plain function, e.g. in unit tests.
        return self.fn(*args, **kwargs)

    def __repr__(self):
        return f"<Task {self.workflow.name}.{self.name}>"

    def __rshift__(self, other):
        for child in _as_tasks(other, ROOTS):
            self.workflow._edge(self, child)
        return other

    def __rrshift__(self, other):
        # [a, b] >> c
        for parent in _as_tasks(other, LEAVES):
            self.workflow._edge(parent, self)
        return self

    def __lshift__(self, other):
        for parent in _as_tasks(other, LEAVES):
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

    def declared_secrets(self) -> tuple[dict[str, str], dict[str, str]]:
        """The secrets and connections this task may read, its workflow's and its own, each as
        {environment variable: name} (a bad declaration counts as none: validation reports it)."""
        found = []
        for kind, option in ((secrets.SECRET, "secrets"), (secrets.CONNECTION, "connections")):
            merged = {}
            for value in (getattr(self.workflow, option, None), getattr(self, option)):
                try:
                    merged.update(secrets.declaration(kind, value))
                except ValueError:
                    pass
            found.append(merged)
        return found[0], found[1]

    @property
    def retry_policy(self) -> RetryPolicy:
        attempts = self.retries + 1 if isinstance(self.retries, int) else DEFAULT_RETRY.max_attempts
        return RetryPolicy(attempts, self.retry_delay, self.retry_backoff, self.retry_max_delay)

    @property
    def ref(self) -> str:
        if self.approval is not None:
            return APPROVAL_REF
        return f"{self.fn.__module__}:{self.fn.__qualname__}" if self.fn else ""

    def to_spec(self, upstream: list[str], children: Iterable[str] = (), mapped_by: Iterable[str] = ()) -> dict:
        spec = {
            "kind": "python" if self.fn is not None or self.approval is not None else "shell",
            **self.retry_policy.spec(),
            "timeout": self.timeout,
            "queue": self.queue,
            "priority": self.priority,
            "trigger_rule": self.trigger_rule,
            "upstream": sorted(upstream),
        }
        if self.fn is not None or self.approval is not None:
            spec["ref"] = self.ref
        else:
            spec["command"] = self.command
            spec["env"] = self.env
        # The options below are written only when used, so a graph that uses none of them keeps
        # the hash (and version) it had before they existed.
        spec.update(self._options_spec(children, mapped_by))
        return spec

    def _options_spec(self, children: Iterable[str], mapped_by: Iterable[str]) -> dict:
        """The spec's keys of the options this task uses (mapping, branching, sensing, approval,
        datasets, callbacks)."""
        spec = {}
        if self.map_over is not None:
            spec["map_over"] = self.map_over.name
            if self.max_parallel is not None:
                spec["max_parallel"] = self.max_parallel
        if self.group is not None:
            # The path of groups, outermost first: a task run's own spec says where it is drawn.
            spec["group"] = self.group.path
        if mapped_by:
            # The worker checks this task's result can be mapped (a list, within the item limit).
            spec["mapped_by"] = sorted(mapped_by)
        if self.branch:
            spec["branch"] = True
            spec["children"] = sorted(children)
        if self.sensor is not None:
            spec["sensor"] = dict(self.sensor)
        if self.approval is not None:
            approval = dict(self.approval)
            approval["form"] = {name: param.to_spec() if isinstance(param, Param) else param
                                for name, param in (approval.get("form") or {}).items()}
            spec["approval"] = approval
        if self.produces:
            spec["produces"] = sorted(set(self.produces))
        spec.update(self._secrets_spec())
        callbacks = callback_refs(self.callbacks)
        if callbacks:
            spec["callbacks"] = callbacks
        return spec

    def _secrets_spec(self) -> dict:
        """The names the task may read; a shell task's also by variable (its environment)."""
        spec = {}
        for option, declared in zip(("secrets", "connections"), self.declared_secrets(), strict=True):
            if declared:
                spec[option] = sorted(set(declared.values()))
                if self.fn is None and self.approval is None:
                    spec[f"{option[:-1]}_env"] = declared
        return spec


ROOTS, LEAVES = "roots", "leaves"


class TaskGroup:
    """Tasks shown together: ``with wf.group("extract", tooltip="..."):`` around their definitions
    (groups nest). A folded group is one row of the grid and one node of the graph.

    A group does not prefix its tasks' names (Airflow's ``extract.load``): task names stay the
    workflow's own, unique across it, so moving a task into a group, out of it or to another one
    never renames it and its history, links and API name stay. A group's name shares that space:
    no group is named as a task or as another group, so a name says which one it is.

    ``a >> group`` makes the group's first tasks (those with no parent inside it) run after a;
    ``group >> b`` makes b run after its last tasks (no child inside it); ``group_a >> group_b``
    both. The tasks are those defined in it so far."""

    def __init__(self, workflow, name: str, *, tooltip: str = "", parent: TaskGroup | None = None):
        self.workflow = workflow
        self.name = name
        self.tooltip = tooltip
        self.parent = parent
        self.tasks: list[Task] = []  # its own, not its subgroups'
        self.children: list[TaskGroup] = []
        if parent is not None:
            parent.children.append(self)

    def __repr__(self):
        return f"<TaskGroup {self.workflow.name}.{self.name}>"

    def __enter__(self) -> TaskGroup:
        self.workflow._open_groups.append(self)
        return self

    def __exit__(self, *exc_info) -> None:
        self.workflow._open_groups.remove(self)

    @property
    def path(self) -> list[str]:
        """The names of this group and the groups around it, outermost first."""
        return [*(self.parent.path if self.parent is not None else []), self.name]

    def members(self) -> list[Task]:
        """Its tasks and its subgroups' tasks, in the order they were defined."""
        found = list(self.tasks)
        for child in self.children:
            found += child.members()
        return found

    def ends(self, which: str) -> list[Task]:
        """Its first tasks (ROOTS: no parent inside the group) or last ones (LEAVES: no child in it)."""
        members = self.members()
        inside = {task.name for task in members}
        upstream = self.workflow.upstream_of()
        if which == ROOTS:
            return [task for task in members if not upstream.get(task.name, set()) & inside]
        linked = {parent for name in inside for parent in upstream.get(name, ())}
        return [task for task in members if task.name not in linked]

    def __rshift__(self, other):
        for parent in _as_tasks(self, LEAVES):
            for child in _as_tasks(other, ROOTS):
                self.workflow._edge(parent, child)
        return other

    def __rrshift__(self, other):
        for parent in _as_tasks(other, LEAVES):
            for child in _as_tasks(self, ROOTS):
                self.workflow._edge(parent, child)
        return self

    def __lshift__(self, other):
        # group << a: a runs before the group
        self.__rrshift__(other)
        return other

    def __rlshift__(self, other):
        # [a, b] << group: the group runs before them
        self.__rshift__(other)
        return self

    def to_spec(self) -> dict:
        return {"parent": self.parent.name if self.parent is not None else None, "tooltip": self.tooltip}


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


class Notify:
    """A notification rule of a workflow: on these events, email these people and post to these
    chat webhooks (Slack's or Teams' incoming webhooks, or any receiver of their JSON).

        Notify(on=["run_failed", "deadline_missed"], email=["data-team@example.com"],
               slack=["https://hooks.slack.com/services/..."], teams=["https://....webhook.office.com/..."])
    """

    def __init__(self, on, *, email: Iterable[str] = (), slack: Iterable[str] = (), teams: Iterable[str] = ()):
        self.on = [on] if isinstance(on, str) else list(on) if isinstance(on, list | tuple | set) else on
        self.email = [email] if isinstance(email, str) else list(email)
        self.slack = [slack] if isinstance(slack, str) else list(slack)
        self.teams = [teams] if isinstance(teams, str) else list(teams)

    def __repr__(self):
        return f"Notify(on={self.on!r})"

    def to_spec(self) -> dict:
        return {"on": sorted(set(self.on)), "email": list(self.email), "slack": list(self.slack),
                "teams": list(self.teams)}


def callables(value) -> list:
    """A callback option's functions: none, one, or a list of them."""
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def callback_ref(fn) -> str:
    """A callback's "module:qualname" (what a job names), or "" when it has none."""
    if not inspect.isfunction(fn):  # a plain function (not a task, a builtin or a bound method)
        return ""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    return f"{module}:{qualname}" if module and qualname else ""


def register_callbacks(callbacks: dict) -> None:
    # A callback runs as a job on a worker, which runs registered functions only.
    for value in callbacks.values():
        for fn in callables(value):
            ref = callback_ref(fn)
            if ref:
                registry.register(fn, ref)


def callback_refs(callbacks: dict) -> dict[str, list[str]]:
    return {event: [callback_ref(fn) for fn in callables(value)]
            for event, value in sorted(callbacks.items()) if callables(value)}


def _as_tasks(value, which: str = ROOTS) -> list[Task]:
    """The tasks a side of ``>>`` stands for: a group stands for its first tasks (``which`` ROOTS,
    where it is the child) or its last ones (LEAVES, where it is the parent)."""
    if isinstance(value, Task):
        return [value]
    if isinstance(value, TaskGroup):
        found = value.ends(which)
        if not found:
            module = getattr(value.workflow, "module", "")
            value.workflow._error(f"groups.{value.name}", value.name, "has no task yet where it is used in >> or <<: "
                                  f"define its tasks first (in module {module})")
        return found
    if isinstance(value, list | tuple | set) and all(isinstance(item, Task | TaskGroup) for item in value):
        return [task for item in value for task in _as_tasks(item, which)]
    raise TypeError(f"a dependency must be a task, a group or a list of them, got {value!r}")
