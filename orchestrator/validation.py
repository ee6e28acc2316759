"""Every check of a workflow definition, in one place: sync runs them before it writes anything,
and ``wf.test()`` before a local run. A new task option means ``orchestrator.definition`` (the
option and its spec) and a check here.

Each problem names the workflow, the field and the value (a ``DefinitionError``); problems are
collected, not raised, so each is reported. ``validate`` checks one workflow (the graph's cycle
included); ``dataset_cycles`` checks all of them together (a workflow that would start itself
again through other workflows' data). Nothing is written before this passed: a value the database
cannot hold (too long, a NUL character, what JSON cannot hold) is one of these problems, not an
error of the database.
"""

from __future__ import annotations

import graphlib
import inspect
import math
import re
from collections import deque

from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from orchestrator import cron, limits, retries, secrets
from orchestrator.definition import (
    CATCHUP_POLICIES,
    NOTIFY_EVENTS,
    OVERLAP_POLICIES,
    PARAM_TYPE_NAMES,
    TRIGGER_MODES,
    TRIGGER_RULES,
    DefinitionError,
    Notify,
    On,
    Param,
    Schedule,
    callables,
    callback_ref,
)
from orchestrator.params import ParamError, clean_param, clean_params

MODULE_LEVEL = "defined at module level"
DATASET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,199}$")


def validate(wf) -> list[DefinitionError]:
    """Every problem of a workflow definition (an ``orchestrator.dsl.Workflow``)."""
    errors = list(wf.errors)

    def error(field_name, value, message):
        errors.append(DefinitionError(wf.name, field_name, value, message))

    _check_workflow(wf, error)
    children = wf.children_of()
    produced = set()
    for name, task in wf.tasks.items():
        produced.update(_check_task(wf, name, task, children[name], error))
    _check_cycle(wf, error)
    _check_groups(wf, error)
    _check_params(wf, error)
    seen_names: set[str] = set()
    for index, schedule in enumerate(wf.schedules):
        _check_schedule(wf, index, schedule, seen_names, error)
    _check_triggers(wf, produced, error)
    if not errors:
        _check_storable(wf, error)
    return errors


def schedule_name(wf, index: int) -> str:
    """The name of the workflow's schedule at ``index``: its own, else "default" for the first."""
    schedule = wf.schedules[index]
    return schedule.name or ("default" if index == 0 else f"schedule-{index + 1}")


def _is_number(value, *, minimum=0.0, allow_none=False, integer=False) -> bool:
    if value is None:
        return allow_none
    if isinstance(value, bool) or not isinstance(value, int if integer else int | float):
        return False
    return minimum <= value <= limits.MAX_INT and not (isinstance(value, float) and not math.isfinite(value))


def _positive(value, allow_none=True) -> bool:
    if value is None:
        return allow_none
    return not isinstance(value, bool) and isinstance(value, int | float) and value > 0


# --- the workflow ----------------------------------------------------------------------------------

def _check_workflow(wf, error) -> None:
    """The workflow's own fields: its name (which must fit in a URL), texts and options."""
    problem = limits.text_problem(wf.name, limits.WORKFLOW_NAME, allow_empty=False)
    if problem:
        error("name", wf.name, f"{problem}; a name is stored and appears in URLs")
    elif not limits.routable(wf.name):
        error("name", wf.name, f"cannot appear in a URL: {limits.NAME_RULE}")
    if not wf.tasks:
        error("tasks", [], "a workflow needs at least one task")
    problem = limits.text_problem(wf.description, 10**9)
    if problem:
        error("description", wf.description, problem)
    for index, tag in enumerate(wf.tags):
        problem = limits.text_problem(tag, limits.WORKFLOW_NAME)
        if problem:
            error(f"tags[{index}]", tag, problem)
    problem = limits.text_problem(wf.owner, limits.OWNER)
    if problem:
        error("owner", wf.owner, problem)
    if not isinstance(wf.tenant, str) or not wf.tenant.strip():
        error("tenant", wf.tenant, "must be a non-empty string")
    elif problem := limits.text_problem(wf.tenant, limits.TENANT):
        error("tenant", wf.tenant, problem)
    _check_run_options(wf, error)
    check_secrets_declared("", wf, error)


def check_secrets_declared(where: str, holder, error) -> None:
    """A workflow's or task's ``secrets=`` and ``connections=``: names (or, for a shell task's
    environment, {variable: name}); a variable may not also be one of the task's ``env=``."""
    for kind, option in ((secrets.SECRET, "secrets"), (secrets.CONNECTION, "connections")):
        value = getattr(holder, option, None)
        if problem := secrets.declaration_problem(kind, value):
            error(f"{where}{option}", value, problem)
        elif isinstance(getattr(holder, "env", None), dict):
            for variable in secrets.declaration(kind, value):
                if variable in holder.env:
                    error(f"{where}{option}", variable, "is also a variable of env=: give the secret another name")


def _check_run_options(wf, error) -> None:
    """What applies to each run: how many at once, webhooks, deadline, timeout, callbacks."""
    if not _is_number(wf.max_active_runs, minimum=1, allow_none=True, integer=True):
        error("max_active_runs", wf.max_active_runs, "must be a whole number of at least 1, or None")
    for url in wf.webhooks:
        _check_url("webhooks", url, error)
    if not _positive(wf.deadline):
        error("deadline", wf.deadline, "must be a positive number of seconds after the logical date, or None")
    if not _positive(wf.run_timeout):
        error("run_timeout", wf.run_timeout, "must be a positive number of seconds, or None")
    _check_callbacks("", wf.callbacks, error)
    for index, rule in enumerate(wf.notify):
        check_notify_rule(f"notify[{index}]", rule, error)


def _check_url(where: str, url, error) -> None:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        error(where, url, "must be an http:// or https:// URL")
    elif problem := limits.text_problem(url, limits.URL):
        error(where, url, problem)


def check_notify_rule(where: str, rule, error) -> None:
    """A ``Notify``: known events, and addresses and URLs a message can be sent to."""
    if not isinstance(rule, Notify):
        error(where, rule, 'a notification rule is Notify(on=[...], email=[...], slack=[...], teams=[...])')
        return
    events = rule.on if isinstance(rule.on, list) else None
    if not events:
        error(f"{where}.on", rule.on, f"name at least one event of {', '.join(NOTIFY_EVENTS)}")
    for event in events or ():
        if event not in NOTIFY_EVENTS:
            error(f"{where}.on", event, f"unknown event: use {', '.join(NOTIFY_EVENTS)}")
    for address in rule.email:
        if not _is_email(address):
            error(f"{where}.email", address, f"must be an email address (at most {limits.EMAIL} characters)")
    for kind in ("slack", "teams"):
        for url in getattr(rule, kind):
            _check_url(f"{where}.{kind}", url, error)
    if not (rule.email or rule.slack or rule.teams):
        error(where, rule, "tells nobody: give email=, slack= or teams=")


def _is_email(address) -> bool:
    if not isinstance(address, str) or len(address) > limits.EMAIL:
        return False
    try:
        validate_email(address)
    except ValidationError:
        return False
    return True


def _check_callbacks(where: str, callbacks: dict, error) -> None:
    for event, value in callbacks.items():
        for fn in callables(value):
            if not inspect.isfunction(fn) or not callback_ref(fn):
                error(f"{where}{event}", fn, "a callback must be a plain function (it is called as a job)")
            elif "<locals>" in getattr(fn, "__qualname__", "<locals>") or fn.__name__ == "<lambda>":
                error(f"{where}{event}", getattr(fn, "__qualname__", fn), f"a callback must be a function {MODULE_LEVEL}")


# --- the tasks and the graph -----------------------------------------------------------------------

def _check_task(wf, name, task, children: set, error) -> list[str]:
    """Everything a task declares; returns the datasets it produces."""
    where = f"tasks.{name}"
    if not isinstance(name, str) or not limits.NAME_RE.match(name):
        error(f"{where}.name", name, "use letters, digits, '_', '-' or '.'")
    _check_task_body(where, task, error)
    _check_task_retries(where, task, error)
    _check_task_placement(wf, where, task, error)
    _check_callbacks(f"{where}.", task.callbacks, error)
    check_secrets_declared(f"{where}.", task, error)
    produced = _check_datasets(f"{where}.produces", task.produces, error)
    if not isinstance(task.branch, bool):
        error(f"{where}.branch", task.branch, "must be True or False")
    elif task.branch and not children:
        error(f"{where}.branch", name, "a branch task needs children to choose from")
    if task.sensor is not None:
        _check_sensor(where, name, task, error)
    if task.map_over is not None:
        _check_mapping(where, name, task, error)
    return produced


def _check_task_body(where: str, task, error) -> None:
    """What the task runs: a module-level function, an approval, or a shell command."""
    if task.fn is not None and "<locals>" in task.fn.__qualname__:
        error(f"{where}.fn", task.fn.__qualname__, f"a task function must be {MODULE_LEVEL}")
    if task.approval is not None:
        _check_approval(where, task, error)
    elif task.fn is None and (not isinstance(task.command, str) or not task.command.strip()):
        error(f"{where}.command", task.command, "a shell task needs a non-empty command")
    elif task.fn is None and (problem := limits.text_error(task.command, "the command")):
        error(f"{where}.command", task.command, problem)


def _check_task_retries(where: str, task, error) -> None:
    if limits.int_problem(task.retries, 0, limits.MAX_ATTEMPTS - 1):
        error(f"{where}.retries", task.retries, f"must be a whole number from 0 to {limits.MAX_ATTEMPTS - 1}")
    for option in ("retry_delay", "retry_backoff", "retry_max_delay"):
        value = getattr(task, option)
        if message := retries.problem(option, value):
            error(f"{where}.{option}", value, message)
    if task.timeout is not None and not (_is_number(task.timeout) and task.timeout > 0):
        error(f"{where}.timeout", task.timeout, "must be a positive number of seconds, or None")


def _check_task_placement(wf, where: str, task, error) -> None:
    """Where and when the task runs: its queue, priority, trigger rule and parents."""
    if not isinstance(task.queue, str) or not limits.QUEUE_RE.match(task.queue):
        error(f"{where}.queue", task.queue, "use letters, digits, '_', '-' or '.'")
    if limits.int_problem(task.priority, limits.PRIORITY_MIN, limits.PRIORITY_MAX):
        error(f"{where}.priority", task.priority,
              f"must be a whole number from {limits.PRIORITY_MIN} to {limits.PRIORITY_MAX}")
    if task.trigger_rule not in TRIGGER_RULES:
        error(f"{where}.trigger_rule", task.trigger_rule, f"must be one of {', '.join(TRIGGER_RULES)}")
    for parent in task.upstream_names:
        if parent not in wf.tasks:
            error(f"{where}.upstream", parent, "depends on an unknown task")


def _check_groups(wf, error) -> None:
    """Task groups: each named as no task and no other group is (the grid's rows and the graph's
    nodes are named by both), holding at least one task. The module is named: a group's mistake
    is found where it was written."""
    seen: set[str] = set()
    module = f" (in module {wf.module})" if wf.module else ""
    for group in getattr(wf, "groups", ()):
        name = group.name
        where = f"groups.{name}"
        if not isinstance(name, str) or not limits.NAME_RE.match(name):
            error(where, name, f"a group name must {limits.NAME_RULE}{module}")
        elif name in wf.tasks:
            error(where, name, f"a task has this name too: name the group otherwise{module}")
        elif name in seen:
            error(where, name, f"two groups have this name{module}")
        else:
            seen.add(name)
        if problem := limits.text_problem(group.tooltip, 2000):
            error(f"{where}.tooltip", group.tooltip, problem)
        if not group.members():
            error(where, name, f"the group has no task: define at least one inside its with block{module}")


def _check_sensor(where: str, name: str, task, error) -> None:
    if task.fn is None:
        error(f"{where}.sensor", name, "a sensor is a Python function")
    if not _positive(task.sensor.get("every"), allow_none=False):
        error(f"{where}.every", task.sensor.get("every"), "must be a positive number of seconds")
    if not _positive(task.sensor.get("timeout")):
        error(f"{where}.timeout", task.sensor.get("timeout"), "must be a positive number of seconds, or None")
    if task.branch:
        error(f"{where}.branch", name, "a sensor cannot also be a branch")


def _check_approval(where: str, task, error) -> None:
    """An approval's question, answers, form fields, timeout and groups."""
    approval = task.approval
    if problem := limits.text_problem(approval["ask"], 2000, allow_empty=False):
        error(f"{where}.ask", approval["ask"], problem)
    _check_approval_options(where, approval, error)
    _check_approval_form(where, approval, error)
    if not _positive(approval["timeout"]):
        error(f"{where}.timeout", approval["timeout"], "must be a positive number of seconds, or None (no timeout)")
    for group in approval["groups"]:
        if limits.text_problem(group, 150, allow_empty=False):
            error(f"{where}.groups", group, "a group is named by a non-empty string of at most 150 characters")
    if task.map_over is not None or task.branch or task.sensor is not None:
        error(where, task.name, "an approval is neither mapped, a branch nor a sensor")


def _check_approval_options(where: str, approval: dict, error) -> None:
    """The answers to choose from, and which of them reject."""
    options = approval["options"]
    if not options:
        error(f"{where}.options", options, "give at least one answer to choose from")
    for option in options:
        if not isinstance(option, str) or not limits.NAME_RE.match(option) or len(option) > 50:
            error(f"{where}.options", option, "an answer uses letters, digits, '_', '-' or '.', at most 50 characters")
    if len(set(map(str, options))) != len(options):
        error(f"{where}.options", options, "two answers are the same")
    for option in approval["reject"]:
        if option not in options:
            error(f"{where}.reject", option, f"not one of the options ({', '.join(map(str, options))})")


def _check_approval_form(where: str, approval: dict, error) -> None:
    for name, param in approval["form"].items():
        if not isinstance(param, Param):
            error(f"{where}.form.{name}", param, "a form field is a Param(type, default=..., choices=...)")
        elif param.type not in PARAM_TYPE_NAMES:
            error(f"{where}.form.{name}.type", param.type, f"must be one of {', '.join(PARAM_TYPE_NAMES)}")
        elif not limits.NAME_RE.match(str(name)):
            error(f"{where}.form", name, f"a field name must {limits.NAME_RULE}")


def _check_mapping(where: str, name: str, task, error) -> None:
    if task.branch:
        error(f"{where}.map", name, "a branch task cannot be mapped")
    if task.map_over.branch:
        error(f"{where}.map", task.map_over.name, "cannot map over a branch task (its result names children)")
    if task.max_parallel is not None and not (
            isinstance(task.max_parallel, int) and not isinstance(task.max_parallel, bool)
            and task.max_parallel >= 1):
        error(f"{where}.max_parallel", task.max_parallel, "must be a whole number of at least 1, or None")


def _check_cycle(wf, error) -> None:
    """A task that depends on itself, through any number of others: the message names the cycle,
    from the task of it declared first."""
    order = list(wf.tasks)
    graph = {name: [parent for parent in parents if parent in wf.tasks] for name, parents in wf.upstream_of().items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        cycle = exc.args[1][:-1]  # each task a parent of the next, the first one repeated at the end
        start = cycle.index(min(cycle, key=order.index))
        path = [*cycle[start:], *cycle[:start], cycle[start]]
        error("tasks", " -> ".join(path), f"the graph has a cycle: {' -> '.join(path)}")


def dataset_links(wf) -> tuple[list[str], list[str]]:
    """The datasets a workflow's tasks produce and those its triggers consume (names only: sync
    carries them from the module's import as plain data)."""
    produces, consumes = [], []
    for task in wf.tasks.values():
        produces += [d for d in (task.produces if isinstance(task.produces, list | tuple) else ()) if isinstance(d, str)]
    for on in wf.triggers:
        datasets = getattr(on, "datasets", [])
        consumes += [d for d in (datasets if isinstance(datasets, list | tuple) else ()) if isinstance(d, str)]
    return produces, consumes


def dataset_cycles(workflows: list) -> dict[str, str]:
    """Workflows that would start themselves again through other workflows' data (a loop
    workflow -> dataset -> workflow -> ...): {workflow name: message}. Each message names the
    shortest such loop through its own workflow."""
    return dataset_cycles_of({wf.name: dataset_links(wf) for wf in workflows})


def dataset_cycles_of(links: dict[str, tuple[list[str], list[str]]]) -> dict[str, str]:
    """dataset_cycles() of {workflow name: (datasets produced, datasets consumed)}."""
    edges: dict[tuple, set] = {}
    for name, (produces, consumes) in links.items():
        for dataset in produces:
            edges.setdefault(("workflow", name), set()).add(("dataset", dataset))
        for dataset in consumes:
            edges.setdefault(("dataset", dataset), set()).add(("workflow", name))
    found: dict[str, str] = {}
    for name in links:
        loop = _loop_through(("workflow", name), edges)
        if loop:
            path = " -> ".join(step for _, step in loop)
            found[name] = str(DefinitionError(name, "triggers", path, f"data triggers form a loop: {path}"))
    return found


def _loop_through(start: tuple, edges: dict[tuple, set]) -> list[tuple] | None:
    """The shortest path from ``start`` back to it through at least one other workflow (a workflow
    consuming its own data is reported by validate()), or None: a breadth-first search whose
    state is (node, whether another workflow was passed)."""
    first = (start, False)
    came_from: dict = {first: None}
    queue = deque([first])
    while queue:
        state = queue.popleft()
        node, other = state
        for nxt in sorted(edges.get(node, ())):
            passed = other or (nxt[0] == "workflow" and nxt != start)
            if nxt == start and passed:
                path = [nxt]
                while state is not None:
                    path.append(state[0])
                    state = came_from[state]
                return path[::-1]
            following = (nxt, passed)
            if nxt != start and following not in came_from:
                came_from[following] = state
                queue.append(following)
    return None


# --- params, schedules, data ------------------------------------------------------------------------

def _check_params(wf, error) -> None:
    for key, param in wf.params.items():
        where = f"params.{key}"
        if problem := limits.text_problem(key, limits.WORKFLOW_NAME, allow_empty=False):
            error("params", key, f"a param name {problem}")
            continue
        if param.type not in PARAM_TYPE_NAMES:
            error(f"{where}.type", param.type, f"must be one of {', '.join(PARAM_TYPE_NAMES)}")
            continue
        if not param.required and param.default is not None:
            try:
                clean_param(param.to_spec(), param.default)
            except ValueError as exc:
                error(f"{where}.default", param.default, str(exc))


def _check_schedule(wf, index: int, schedule, seen_names: set, error) -> None:
    where = f"schedules[{index}]"
    if not isinstance(schedule, Schedule):
        error(where, schedule, "a schedule is Schedule(cron, ...)")
        return
    _check_schedule_timing(where, schedule, error)
    if schedule.catchup not in CATCHUP_POLICIES:
        error(f"{where}.catchup", schedule.catchup, f"must be one of {', '.join(CATCHUP_POLICIES)}")
    if schedule.overlap not in OVERLAP_POLICIES:
        error(f"{where}.overlap", schedule.overlap, f"must be one of {', '.join(OVERLAP_POLICIES)}")
    name = schedule_name(wf, index)
    if problem := limits.text_problem(name, limits.SCHEDULE_NAME, allow_empty=False):
        error(f"{where}.name", name, problem)
        name = None
    elif name in seen_names:
        error(f"{where}.name", name, "two schedules of this workflow have this name")
    seen_names.add(name)
    _check_schedule_params(wf, where, name, schedule, error)


def _check_schedule_timing(where: str, schedule, error) -> None:
    if problem := limits.text_problem(schedule.cron, limits.CRON, allow_empty=False):
        error(f"{where}.cron", schedule.cron, problem)
    elif problem := limits.text_problem(schedule.timezone, limits.TIMEZONE, allow_empty=False):
        error(f"{where}.timezone", schedule.timezone, problem)
    else:
        try:
            cron.validate(schedule.cron, schedule.timezone)
        except cron.CronError as exc:
            bad = "timezone" if "timezone" in str(exc) else "cron"
            error(f"{where}.{bad}", getattr(schedule, bad), str(exc))
    if not _is_number(schedule.jitter, integer=True):
        error(f"{where}.jitter", schedule.jitter, "must be a whole number of seconds, 0 or more")
    if schedule.start_deadline is not None and not (_is_number(schedule.start_deadline) and schedule.start_deadline > 0):
        error(f"{where}.start_deadline", schedule.start_deadline, "must be a positive number of seconds, or None")
    if not _is_number(schedule.max_catchup, minimum=1, allow_none=True, integer=True):
        error(f"{where}.max_catchup", schedule.max_catchup, "must be a whole number of at least 1, or None")


def _check_schedule_params(wf, where: str, name, schedule, error) -> None:
    """A schedule's params must make a run: every fire time would otherwise be a skipped run."""
    if not isinstance(schedule.params, dict):
        error(f"{where}.params", schedule.params, "must be a dict of param values")
        return
    if problem := limits.json_problem(schedule.params):
        error(f"{where}.params", schedule.params, problem)
        return
    declared = {key: param.to_spec() for key, param in wf.params.items() if param.type in PARAM_TYPE_NAMES}
    if len(declared) < len(wf.params):
        return  # a param of unknown type is reported already; its values cannot be checked
    try:
        clean_params(declared, schedule.params)
    except ParamError as exc:
        label = f"schedule {limits.safe_repr(name)}" if name is not None else "this schedule"
        for key, message in exc.errors.items():
            value = schedule.params.get(key)
            if message == "this param is required":
                message = f"{label} gives no value for the required param {limits.safe_repr(key)}"
            else:
                message = f"{message} (in the params of {label})"
            error(f"{where}.params.{key}", value, message)


def _check_datasets(field: str, names, error) -> list[str]:
    if isinstance(names, str) or not isinstance(names, list | tuple):
        error(field, names, "must be a list of dataset names")
        return []
    for name in names:
        if not isinstance(name, str) or not DATASET_RE.match(name):
            error(field, name, "a dataset name uses letters, digits and _ . : / @ + -, up to 200 characters")
    return [name for name in names if isinstance(name, str)]


def _check_triggers(wf, produced: set, error) -> None:
    seen: dict[str, int] = {}
    for index, on in enumerate(wf.triggers):
        where = f"triggers[{index}]"
        if not isinstance(on, On):
            error(where, on, 'a trigger is On("dataset", ...)')
            continue
        if on.mode not in TRIGGER_MODES:
            error(f"{where}.mode", on.mode, f"must be one of {', '.join(TRIGGER_MODES)}")
        if not on.datasets:
            error(f"{where}.datasets", [], "name at least one dataset")
        for dataset in _check_datasets(f"{where}.datasets", on.datasets, error):
            if dataset in seen and seen[dataset] != index:
                error(f"{where}.datasets", dataset, f"already in triggers[{seen[dataset]}]: a dataset can start "
                                                    "a workflow through one trigger only")
            seen.setdefault(dataset, index)
            if dataset in produced:
                error(f"{where}.datasets", dataset, "this workflow produces it: each run would start the next")
    if wf.triggers:
        for key, param in wf.params.items():
            if param.required:
                error(f"params.{key}", key, "a workflow started by data triggers needs a default for every param")


def _check_storable(wf, error) -> None:
    """What the checks above do not name but the database would refuse: the stored graph as JSON."""
    try:
        problem = limits.json_problem(wf.to_spec())
    except Exception as exc:  # noqa: BLE001 - user values (a failing __eq__, __iter__) end up here
        problem = f"the definition cannot be written down: {type(exc).__name__}: {exc}"
    if problem:
        error("definition", wf.name, problem)
