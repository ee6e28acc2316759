"""Validation of what a workflow declares beyond a fixed graph: mapping, branches, sensors,
datasets and data triggers, callbacks, the run deadline and the run timeout.

Called by sync for each workflow (``validate``) and once for all workflows together
(``dataset_cycles``: a workflow that would start itself again through its data). Each problem
names the workflow, the field and the value, like the rest of sync's messages.
"""

from __future__ import annotations

import inspect
import re

import networkx

from orchestrator import dsl

MODULE_LEVEL = "defined at module level"
DATASET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,199}$")


def _positive(value, allow_none=True) -> bool:
    if value is None:
        return allow_none
    return not isinstance(value, bool) and isinstance(value, int | float) and value > 0


def _check_callbacks(error, where: str, callbacks: dict) -> None:
    for event, value in callbacks.items():
        for fn in dsl._callables(value):
            if not inspect.isfunction(fn) or not dsl.callback_ref(fn):
                error(f"{where}{event}", fn, "a callback must be a plain function (it is called as a job)")
            elif "<locals>" in getattr(fn, "__qualname__", "<locals>") or fn.__name__ == "<lambda>":
                error(f"{where}{event}", getattr(fn, "__qualname__", fn), f"a callback must be a function {MODULE_LEVEL}")


def _check_datasets(error, field: str, names) -> list[str]:
    if isinstance(names, str) or not isinstance(names, list | tuple):
        error(field, names, "must be a list of dataset names")
        return []
    for name in names:
        if not isinstance(name, str) or not DATASET_RE.match(name):
            error(field, name, "a dataset name uses letters, digits and _ . : / @ + -, up to 200 characters")
    return [name for name in names if isinstance(name, str)]


def validate(wf: dsl.Workflow) -> list[dsl.DefinitionError]:
    errors: list[dsl.DefinitionError] = []

    def error(field_name, value, message):
        errors.append(dsl.DefinitionError(wf.name, field_name, value, message))

    if not _positive(wf.deadline):
        error("deadline", wf.deadline, "must be a positive number of seconds after the logical date, or None")
    if not _positive(wf.run_timeout):
        error("run_timeout", wf.run_timeout, "must be a positive number of seconds, or None")
    _check_callbacks(error, "", wf.callbacks)
    children = wf.children_of()
    produced = set()
    for name, task in wf.tasks.items():
        produced.update(_check_task(error, name, task, children[name]))
    _check_triggers(error, wf, produced)
    return errors


def _check_task(error, name: str, task: dsl.Task, children: set) -> list[str]:
    """A task's callbacks, branch, sensor and mapping; returns the datasets it produces."""
    where = f"tasks.{name}"
    _check_callbacks(error, f"{where}.", task.callbacks)
    produced = _check_datasets(error, f"{where}.produces", task.produces)
    if not isinstance(task.branch, bool):
        error(f"{where}.branch", task.branch, "must be True or False")
    elif task.branch and not children:
        error(f"{where}.branch", name, "a branch task needs children to choose from")
    if task.sensor is not None:
        _check_sensor(error, where, name, task)
    if task.map_over is not None:
        _check_mapping(error, where, name, task)
    return produced


def _check_sensor(error, where: str, name: str, task: dsl.Task) -> None:
    if task.fn is None:
        error(f"{where}.sensor", name, "a sensor is a Python function")
    if not _positive(task.sensor.get("every"), allow_none=False):
        error(f"{where}.every", task.sensor.get("every"), "must be a positive number of seconds")
    if not _positive(task.sensor.get("timeout")):
        error(f"{where}.timeout", task.sensor.get("timeout"), "must be a positive number of seconds, or None")
    if task.branch:
        error(f"{where}.branch", name, "a sensor cannot also be a branch")


def _check_mapping(error, where: str, name: str, task: dsl.Task) -> None:
    if task.branch:
        error(f"{where}.map", name, "a branch task cannot be mapped")
    if task.map_over.branch:
        error(f"{where}.map", task.map_over.name, "cannot map over a branch task (its result names children)")
    if task.max_parallel is not None and not (
            isinstance(task.max_parallel, int) and not isinstance(task.max_parallel, bool)
            and task.max_parallel >= 1):
        error(f"{where}.max_parallel", task.max_parallel, "must be a whole number of at least 1, or None")


def _check_triggers(error, wf: dsl.Workflow, produced: set) -> None:
    seen: dict[str, int] = {}
    for index, on in enumerate(wf.triggers):
        where = f"triggers[{index}]"
        if not isinstance(on, dsl.On):
            error(where, on, 'a trigger is On("dataset", ...)')
            continue
        if on.mode not in dsl.TRIGGER_MODES:
            error(f"{where}.mode", on.mode, f"must be one of {', '.join(dsl.TRIGGER_MODES)}")
        if not on.datasets:
            error(f"{where}.datasets", [], "name at least one dataset")
        for dataset in _check_datasets(error, f"{where}.datasets", on.datasets):
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


def dataset_cycles(workflows: list[dsl.Workflow]) -> dict[str, str]:
    """Workflows that would start themselves again through other workflows' data (a loop
    workflow -> dataset -> workflow -> ...): {workflow name: message}."""
    graph = networkx.DiGraph()
    for wf in workflows:
        for task in wf.tasks.values():
            for dataset in task.produces if isinstance(task.produces, list | tuple) else ():
                if isinstance(dataset, str):
                    graph.add_edge(("workflow", wf.name), ("dataset", dataset))
        for on in wf.triggers:
            datasets = getattr(on, "datasets", [])
            for dataset in datasets if isinstance(datasets, list | tuple) else ():
                if isinstance(dataset, str):
                    graph.add_edge(("dataset", dataset), ("workflow", wf.name))
    found: dict[str, str] = {}
    # A loop lies inside one strongly connected component; one cycle per component is enough to
    # explain it (listing every cycle can grow exponentially).
    for component in networkx.strongly_connected_components(graph):
        names = sorted(name for kind, name in component if kind == "workflow")
        if len(names) < 2:
            continue  # a workflow consuming its own data is reported by validate()
        cycle = [edge[0] for edge in networkx.find_cycle(graph.subgraph(component))]
        start = cycle.index(min(node for node in cycle if node[0] == "workflow"))
        path = " -> ".join(name for _, name in cycle[start:] + cycle[:start] + [cycle[start]])
        for name in names:
            found[name] = str(dsl.DefinitionError(name, "triggers", path, f"data triggers form a loop: {path}"))
    return found
