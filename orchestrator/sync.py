"""Discovery and sync: import every workflow module (each installed app's ``workflows`` module or
package, and the modules the settings name), validate each workflow (``orchestrator.validation``),
store it, and record a new graph version only when the graph changed.

A module that fails to import is reported and does not stop the others; a workflow that was
valid before and is broken now keeps its last good version and is marked broken.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import pkgutil
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from django.apps import apps
from django.db import DataError, connections, transaction
from django.utils.module_loading import module_has_submodule

from orchestrator import clock, cron, dsl, limits, reload
from orchestrator.conf import app_settings
from orchestrator.models import Schedule, Workflow, WorkflowVersion
from orchestrator.validation import dataset_cycles, schedule_name, validate


@dataclass
class SyncReport:
    created: list[str] = field(default_factory=list)
    new_versions: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    broken: dict[str, str] = field(default_factory=dict)  # workflow -> errors
    import_errors: dict[str, str] = field(default_factory=dict)  # module -> error
    removed: list[str] = field(default_factory=list)
    generation: int = 0  # the code generation this sync recorded

    @property
    def ok(self) -> bool:
        return not self.broken and not self.import_errors


def graph_hash(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()


def _module_names(directory: Path, package: str) -> list[str]:
    return [f"{package}.{path.stem}" for path in sorted(directory.glob("*.py"))
            if not path.name.startswith("_")]


def _import(module_name: str):
    if module_name in sys.modules:
        return importlib.reload(sys.modules[module_name])
    return importlib.import_module(module_name)


def _storable(text: str) -> str:
    """Text as PostgreSQL and a terminal can take it: NUL and unpaired surrogates escaped."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def _import_error(exc: BaseException) -> str:
    return _storable(f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exception(exc)[-3:]))


# Imports sync gave up on, by module: their threads may still run (Python cannot stop a thread).
# While one does, that module is reported again instead of imported a second time, which would
# wait on the first import's module lock.
_abandoned: dict[str, threading.Thread] = {}


def _bounded_import(module_name: str, importer):
    """Run ``importer`` in a daemon thread for at most ORCHESTRATOR_SYNC_IMPORT_TIMEOUT seconds.

    Returns (module, workflows, None) or (None, [], error text). Any exception of the module's
    code is its error, SystemExit and KeyboardInterrupt included; an import that does not end in
    time is abandoned: its thread keeps running in the background until it ends or the process
    exits, and the workflows it creates later are not collected (collect() is per thread)."""
    earlier = _abandoned.get(module_name)
    if earlier is not None:
        if earlier.is_alive():
            return None, [], (f"TimeoutError: an earlier import of {module_name}, abandoned after "
                              f"ORCHESTRATOR_SYNC_IMPORT_TIMEOUT, is still running in this process")
        del _abandoned[module_name]
    timeout = app_settings.SYNC_IMPORT_TIMEOUT
    outcome: dict = {}

    def run():
        try:
            outcome["workflows"] = dsl.collect(lambda: outcome.__setitem__("module", importer()))
        except BaseException as exc:  # noqa: BLE001 - anything the module's code raises is its error
            outcome["error"] = _import_error(exc)
        finally:
            connections.close_all()  # this thread's own, if the module queried the database

    thread = threading.Thread(target=run, name=f"sync import {module_name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        _abandoned[module_name] = thread
        return None, [], (f"TimeoutError: importing {module_name} took longer than {timeout:g}s "
                          f"(ORCHESTRATOR_SYNC_IMPORT_TIMEOUT); sync abandoned it and went on")
    if "error" in outcome:
        return None, [], outcome["error"]
    return outcome.get("module"), outcome.get("workflows", []), None


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
        module, workflows, error = _bounded_import(module_name, lambda: _import(module_name))
        if error is not None:
            failed[module_name] = error
            return None
        found[module_name] = workflows
        return module

    if directory is not None and package is not None:
        directory = Path(directory)
        parent = str(directory.parent)
        if parent not in sys.path:
            sys.path.insert(0, parent)
        for module_name in _module_names(directory, package):
            load(module_name)
        return found, failed
    _load_each(_module_queue(failed), load)
    # A package that imports its own modules created their workflows too: each belongs to the
    # module that defines it, which was imported on its own.
    for name, workflows in found.items():
        found[name] = [wf for wf in workflows if wf.module == name or wf.module not in found]
    return found, failed


def _load_each(queue: list[tuple[str, bool]], load) -> None:
    """Import each module of the queue once (and a package's submodules where asked)."""
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


def _module_queue(failed: dict) -> list[tuple[str, bool]]:
    """The modules to import, in order, each with whether its submodules are imported too: the
    apps' workflows packages, the configured package's modules, the configured modules. A
    configured package that fails to import is recorded in ``failed``."""
    queue = [(name, True) for name in workflow_modules()]
    for name in _configured_packages():
        package_module, _, error = _bounded_import(name, lambda name=name: importlib.import_module(name))
        if error is not None:
            failed[name] = error
            continue
        queue += [(sub, False) for sub in _submodules(package_module)] if hasattr(package_module, "__path__") \
            else [(name, False)]
    return queue + [(name, False) for name in app_settings.WORKFLOW_MODULES]


def sync_workflows(directory: Path | None = None, package: str | None = None, now=None) -> SyncReport:
    """Import, check every workflow, then write: a value the database cannot hold is reported
    with its workflow, field and value before anything is written, and never stops the others."""
    report = SyncReport()
    now = now or clock.now()
    found, failed = discover(directory, package)
    report.import_errors = {name: error.splitlines()[0] for name, error in failed.items()}

    checked = _check_all(found)
    seen = {key for key, _, _, _ in checked}
    for key, wf, module_name, message in checked:
        if message is not None:
            report.broken[key] = message
            _mark_broken(wf.name, module_name, message)
            continue
        try:
            _store(wf, module_name, report, now)
        except DataError as exc:  # a limit the checks above do not know yet: this workflow only
            report.broken[key] = _storable(f"workflow {limits.safe_repr(wf.name)} could not be stored: {exc}")
    _mark_failed_modules(failed, seen, report)
    with transaction.atomic():
        gone = Workflow.objects.filter(present=True).exclude(name__in=seen)
        report.removed = sorted(gone.values_list("name", flat=True))
        gone.update(present=False, synced_at=now)
        # Code can change without a graph changing: every sync is a new code generation, and the
        # workers replace their children to run the code now on disk.
        report.generation = reload.bump()
    return report


def _key(name) -> str:
    """How the report names a workflow: its name, or the name quoted when it is not plain text."""
    return name if isinstance(name, str) and limits.text_error(name, "") is None else limits.safe_repr(name)


def _check_all(found: dict[str, list[dsl.Workflow]]) -> list[tuple[str, dsl.Workflow, str, str | None]]:
    """(report key, workflow, module, errors or None) of each workflow found, written nowhere yet."""
    named = [wf for workflows in found.values() for wf in workflows if isinstance(wf.name, str)]
    loops = dataset_cycles(named)
    checked, seen = [], set()
    for module_name, workflows in found.items():
        for wf in workflows:
            key = _key(wf.name)
            if key in seen:
                checked.append((key, wf, module_name, str(dsl.DefinitionError(
                    wf.name, "name", wf.name, f"defined twice (again in {module_name})"))))
                continue
            seen.add(key)
            try:
                messages = [str(error) for error in validate(wf)]
            except Exception as exc:  # noqa: BLE001 - a user value that breaks a check breaks its workflow only
                messages = [f"workflow {limits.safe_repr(wf.name)} could not be checked: {type(exc).__name__}: {exc}"]
            if isinstance(wf.name, str) and wf.name in loops:
                messages.append(loops[wf.name])
            checked.append((key, wf, module_name, _storable("\n".join(messages)) if messages else None))
    return checked


def _mark_failed_modules(failed: dict[str, str], seen: set[str], report: SyncReport) -> None:
    """Workflows of modules that failed to import are broken, not gone."""
    for module_name, error in failed.items():
        for workflow in Workflow.objects.filter(module=module_name).exclude(name__in=seen):
            seen.add(workflow.name)
            report.broken[workflow.name] = f"module {module_name} failed to import: {error.splitlines()[0]}"
            _mark_broken(workflow.name, module_name, f"module {module_name} failed to import:\n{error}")


def _mark_broken(name, module_name: str, message: str) -> None:
    """Record the error on the workflow's row; a name that cannot be a row (too long, not text, not
    fit for a URL) is only reported, never stored."""
    if not limits.routable(name) or limits.text_problem(module_name, limits.MODULE):
        return
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
