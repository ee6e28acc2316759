"""Discovery and sync: import every workflow module (each installed app's ``workflows`` module or
package, and the modules the settings name), validate each workflow, store it, and record a new
graph version only when the graph changed.

A module that fails to import is reported and does not stop the others; a workflow that was
valid before and is broken now keeps its last good version and is marked broken.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import pkgutil
import re
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import networkx
from django.apps import apps
from django.db import transaction
from django.utils.module_loading import module_has_submodule

from orchestrator import clock, cron, dsl, graph_checks
from orchestrator.conf import app_settings
from orchestrator.models import Schedule, Workflow, WorkflowVersion
from orchestrator.params import clean_param

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
QUEUE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


@dataclass
class SyncReport:
    created: list[str] = field(default_factory=list)
    new_versions: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    broken: dict[str, str] = field(default_factory=dict)  # workflow -> errors
    import_errors: dict[str, str] = field(default_factory=dict)  # module -> error
    removed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.broken and not self.import_errors


def _is_number(value, *, minimum=0.0, allow_none=False, integer=False) -> bool:
    if value is None:
        return allow_none
    if isinstance(value, bool) or not isinstance(value, int if integer else int | float):
        return False
    return value >= minimum


def validate(wf: dsl.Workflow) -> list[dsl.DefinitionError]:
    """Every problem of a workflow definition, each naming the workflow, the field and the value."""
    errors = list(wf.errors)

    def error(field_name, value, message):
        errors.append(dsl.DefinitionError(wf.name, field_name, value, message))

    if not isinstance(wf.name, str) or not NAME_RE.match(wf.name):
        error("name", wf.name, "use letters, digits, '_', '-' or '.', starting with a letter or digit")
    if not wf.tasks:
        error("tasks", [], "a workflow needs at least one task")
    if not isinstance(wf.tenant, str) or not wf.tenant.strip():
        error("tenant", wf.tenant, "must be a non-empty string")
    if not _is_number(wf.max_active_runs, minimum=1, allow_none=True, integer=True):
        error("max_active_runs", wf.max_active_runs, "must be a whole number of at least 1, or None")
    for url in wf.webhooks:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            error("webhooks", url, "must be an http:// or https:// URL")

    for name, task in wf.tasks.items():
        where = f"tasks.{name}"
        if not isinstance(name, str) or not NAME_RE.match(name):
            error(f"{where}.name", name, "use letters, digits, '_', '-' or '.'")
        if task.fn is not None and "<locals>" in task.fn.__qualname__:
            error(f"{where}.fn", task.fn.__qualname__, f"a task function must be {graph_checks.MODULE_LEVEL}")
        if task.fn is None and (not isinstance(task.command, str) or not task.command.strip()):
            error(f"{where}.command", task.command, "a shell task needs a non-empty command")
        if not _is_number(task.retries, integer=True):
            error(f"{where}.retries", task.retries, "must be a whole number, 0 or more")
        if not _is_number(task.retry_delay):
            error(f"{where}.retry_delay", task.retry_delay, "must be a number of seconds, 0 or more")
        if not _is_number(task.retry_backoff, minimum=1):
            error(f"{where}.retry_backoff", task.retry_backoff, "must be a number, 1 or more")
        if not _is_number(task.retry_max_delay):
            error(f"{where}.retry_max_delay", task.retry_max_delay, "must be a number of seconds, 0 or more")
        if task.timeout is not None and not (_is_number(task.timeout) and task.timeout > 0):
            error(f"{where}.timeout", task.timeout, "must be a positive number of seconds, or None")
        if not isinstance(task.queue, str) or not QUEUE_RE.match(task.queue):
            error(f"{where}.queue", task.queue, "use letters, digits, '_', '-' or '.'")
        if isinstance(task.priority, bool) or not isinstance(task.priority, int) or not -100 <= task.priority <= 100:
            error(f"{where}.priority", task.priority, "must be a whole number from -100 to 100")
        if task.trigger_rule not in dsl.TRIGGER_RULES:
            error(f"{where}.trigger_rule", task.trigger_rule, f"must be one of {', '.join(dsl.TRIGGER_RULES)}")
        for parent in task.upstream_names:
            if parent not in wf.tasks:
                error(f"{where}.upstream", parent, "depends on an unknown task")

    graph = networkx.DiGraph()
    graph.add_nodes_from(wf.tasks)
    graph.add_edges_from((parent, child) for child, parents in wf.upstream_of().items()
                         for parent in parents if parent in wf.tasks)
    try:
        cycle = networkx.find_cycle(graph)
    except networkx.NetworkXNoCycle:
        cycle = None
    if cycle:
        path = [edge[0] for edge in cycle] + [cycle[0][0]]
        error("tasks", " -> ".join(path), f"the graph has a cycle: {' -> '.join(path)}")

    for key, param in wf.params.items():
        where = f"params.{key}"
        if param.type not in dsl.PARAM_TYPE_NAMES:
            error(f"{where}.type", param.type, f"must be one of {', '.join(dsl.PARAM_TYPE_NAMES)}")
            continue
        if not param.required and param.default is not None:
            try:
                clean_param(param.to_spec(), param.default)
            except ValueError as exc:
                error(f"{where}.default", param.default, str(exc))

    seen_names = set()
    for index, schedule in enumerate(wf.schedules):
        where = f"schedules[{index}]"
        try:
            cron.validate(schedule.cron, schedule.timezone)
        except cron.CronError as exc:
            bad = "timezone" if "timezone" in str(exc) else "cron"
            error(f"{where}.{bad}", getattr(schedule, bad), str(exc))
        if schedule.catchup not in dsl.CATCHUP_POLICIES:
            error(f"{where}.catchup", schedule.catchup, f"must be one of {', '.join(dsl.CATCHUP_POLICIES)}")
        if schedule.overlap not in dsl.OVERLAP_POLICIES:
            error(f"{where}.overlap", schedule.overlap, f"must be one of {', '.join(dsl.OVERLAP_POLICIES)}")
        if not _is_number(schedule.jitter, integer=True):
            error(f"{where}.jitter", schedule.jitter, "must be a whole number of seconds, 0 or more")
        if schedule.start_deadline is not None and not (_is_number(schedule.start_deadline) and schedule.start_deadline > 0):
            error(f"{where}.start_deadline", schedule.start_deadline, "must be a positive number of seconds, or None")
        if not _is_number(schedule.max_catchup, minimum=1, allow_none=True, integer=True):
            error(f"{where}.max_catchup", schedule.max_catchup, "must be a whole number of at least 1, or None")
        name = schedule_name(wf, index)
        if name in seen_names:
            error(f"{where}.name", name, "two schedules of this workflow have this name")
        seen_names.add(name)
    errors.extend(graph_checks.validate(wf))
    return errors


def schedule_name(wf: dsl.Workflow, index: int) -> str:
    schedule = wf.schedules[index]
    return schedule.name or ("default" if index == 0 else f"schedule-{index + 1}")


def graph_hash(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()


def _module_names(directory: Path, package: str) -> list[str]:
    return [f"{package}.{path.stem}" for path in sorted(directory.glob("*.py"))
            if not path.name.startswith("_")]


def _import(module_name: str):
    if module_name in sys.modules:
        return importlib.reload(sys.modules[module_name])
    return importlib.import_module(module_name)


def _import_error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exception(exc)[-3:])


def _submodules(package) -> list[str]:
    """A package's own modules, not starting with ``_``, in name order."""
    return sorted(f"{package.__name__}.{info.name}" for info in pkgutil.iter_modules(package.__path__)
                  if not info.name.startswith("_"))


def workflow_modules() -> list[str]:
    """The ``workflows`` module of every installed app, found the way the admin finds
    ``admin.py`` (when it is a package, discover() also imports each of its modules)."""
    names = []
    for app_config in apps.get_app_configs():
        if module_has_submodule(app_config.module, "workflows"):
            names.append(f"{app_config.name}.workflows")
    return names


def _configured_packages() -> list[str]:
    return [app_settings.WORKFLOWS_PACKAGE] if app_settings.WORKFLOWS_PACKAGE else []


def discover(directory: Path | None = None, package: str | None = None):
    """Import the workflow modules; returns ({module: [workflows]}, {module: import error}).

    With ``directory`` and ``package`` (tools and tests), only the modules of that folder, imported
    as that package; otherwise the modules of workflow_modules() and the settings."""
    importlib.invalidate_caches()
    found, failed = {}, {}

    def load(module_name: str):
        imported = []
        try:
            found[module_name] = dsl.collect(lambda: imported.append(_import(module_name)))
        except Exception as exc:  # noqa: BLE001 - any error in user code is reported, not raised
            failed[module_name] = _import_error(exc)
            return None
        return imported[0]

    if directory is not None and package is not None:
        directory = Path(directory)
        parent = str(directory.parent)
        if parent not in sys.path:
            sys.path.insert(0, parent)
        for module_name in _module_names(directory, package):
            load(module_name)
        return found, failed

    queue = [(name, True) for name in workflow_modules()]
    for name in _configured_packages():
        try:
            package_module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - reported like a module that fails to import
            failed[name] = _import_error(exc)
            continue
        queue += [(sub, False) for sub in _submodules(package_module)] if hasattr(package_module, "__path__") \
            else [(name, False)]
    queue += [(name, False) for name in app_settings.WORKFLOW_MODULES]
    seen = set()
    for name, expand in queue:
        if name in seen:
            continue
        seen.add(name)
        module = load(name)
        if expand and module is not None and hasattr(module, "__path__"):
            for sub in _submodules(module):
                if sub not in seen:
                    seen.add(sub)
                    load(sub)
    # A package that imports its own modules created their workflows too: each belongs to the
    # module that defines it, which was imported on its own.
    for name, workflows in found.items():
        found[name] = [wf for wf in workflows if wf.module == name or wf.module not in found]
    return found, failed


def sync_workflows(directory: Path | None = None, package: str | None = None, now=None) -> SyncReport:
    report = SyncReport()
    now = now or clock.now()
    found, failed = discover(directory, package)
    report.import_errors = {name: error.splitlines()[0] for name, error in failed.items()}

    seen: set[str] = set()
    loops = graph_checks.dataset_cycles([wf for workflows in found.values() for wf in workflows])
    for module_name, workflows in found.items():
        for wf in workflows:
            if wf.name in seen:
                report.broken[wf.name] = str(dsl.DefinitionError(
                    wf.name, "name", wf.name, f"defined twice (again in {module_name})"))
                continue
            seen.add(wf.name)
            errors = validate(wf)
            if errors or wf.name in loops:
                message = "\n".join([str(error) for error in errors] + ([loops[wf.name]] if wf.name in loops else []))
                report.broken[wf.name] = message
                _mark_broken(wf.name, module_name, message)
            else:
                _store(wf, module_name, report, now)

    # Workflows of modules that failed to import are broken, not gone.
    for module_name, error in failed.items():
        for workflow in Workflow.objects.filter(module=module_name).exclude(name__in=seen):
            seen.add(workflow.name)
            report.broken[workflow.name] = f"module {module_name} failed to import: {error.splitlines()[0]}"
            _mark_broken(workflow.name, module_name, f"module {module_name} failed to import:\n{error}")

    gone = Workflow.objects.filter(present=True).exclude(name__in=seen)
    report.removed = sorted(gone.values_list("name", flat=True))
    gone.update(present=False, synced_at=now)
    return report


def _mark_broken(name: str, module_name: str, message: str) -> None:
    workflow, _ = Workflow.objects.get_or_create(name=name, defaults={"module": module_name})
    Workflow.objects.filter(pk=workflow.pk).update(
        broken=True, sync_error=message, present=True, module=module_name, synced_at=clock.now()
    )


@transaction.atomic
def _store(wf: dsl.Workflow, module_name: str, report: SyncReport, now) -> None:
    spec = wf.to_spec()
    digest = graph_hash(spec)
    workflow, created = Workflow.objects.select_for_update().get_or_create(
        name=wf.name, defaults={"module": module_name}
    )
    version = workflow.versions.filter(hash=digest).first()
    if version is None:
        number = (workflow.versions.order_by("-number").values_list("number", flat=True).first() or 0) + 1
        version = WorkflowVersion.objects.create(workflow=workflow, number=number, hash=digest, spec=spec)
        (report.created if created else report.new_versions).append(wf.name)
    elif workflow.current_version_id != version.pk or workflow.broken:
        report.new_versions.append(wf.name)
    else:
        report.unchanged.append(wf.name)

    fields = {
        "module": module_name, "description": wf.description, "tags": wf.tags, "owner": wf.owner,
        "tenant": wf.tenant, "max_active_runs": wf.max_active_runs, "webhooks": wf.webhooks,
        "current_version": version, "broken": False, "sync_error": "", "present": True,
    }
    changed = [key for key, value in fields.items() if getattr(workflow, key) != value]
    if changed:
        for key in changed:
            setattr(workflow, key, fields[key])
        workflow.synced_at = now
        workflow.save(update_fields=[*changed, "synced_at", "updated_at"])
    _sync_schedules(workflow, wf, now)


def _sync_schedules(workflow: Workflow, wf: dsl.Workflow, now) -> None:
    """Code-declared schedules follow the code; schedules made in the admin are never touched."""
    declared = {}
    for index, schedule in enumerate(wf.schedules):
        declared[schedule_name(wf, index)] = schedule
    existing = {s.name: s for s in workflow.schedules.filter(source=Schedule.Source.CODE)}
    for name, schedule in declared.items():
        values = {
            "cron": " ".join(schedule.cron.split()), "timezone": schedule.timezone, "catchup": schedule.catchup,
            "max_catchup": schedule.max_catchup, "overlap": schedule.overlap,
            "start_deadline": schedule.start_deadline, "jitter": schedule.jitter, "params": schedule.params,
        }
        row = existing.get(name)
        if row is None:
            if workflow.schedules.filter(name=name).exists():
                # An admin schedule already uses this name; the code one gets a distinct name.
                name = f"code-{name}"
                row = existing.get(name)
        if row is None:
            Schedule.objects.create(
                workflow=workflow, name=name, source=Schedule.Source.CODE,
                next_fire_at=cron.next_fire_time(values["cron"], values["timezone"], now), **values,
            )
            continue
        changed = {key: value for key, value in values.items() if getattr(row, key) != value}
        if changed:
            if "cron" in changed or "timezone" in changed:
                changed["next_fire_at"] = cron.next_fire_time(values["cron"], values["timezone"], now)
            Schedule.objects.filter(pk=row.pk).update(updated_at=now, **changed)
    declared_names = set(declared) | {f"code-{name}" for name in declared}
    workflow.schedules.filter(source=Schedule.Source.CODE).exclude(name__in=declared_names).delete()
