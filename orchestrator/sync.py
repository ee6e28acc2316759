"""Sync: store every workflow the project's modules define, checked, and record a new graph
version only when the graph changed.

The modules are imported by ``orchestrator.discovery``, each in a child process of its own that
sends back its workflows as plain data (this process never imports a workflow module). A module
that fails to import, or takes longer than ``ORCHESTRATOR_SYNC_IMPORT_TIMEOUT``, is reported and
does not stop the others; a workflow that was valid before and is broken now keeps its last good
version and is marked broken.

Two modules that define the same workflow name: the module the workflow was stored from stays
its owner (a new file never breaks a working workflow); when neither was stored, the first by
path wins. The other definition is reported, naming both files, and written nowhere.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django.db import DataError, transaction

from orchestrator import clock, cron, limits, reload
from orchestrator.discovery import Definition, Discovery, discover, discover_all, storable, workflow_modules
from orchestrator.models import Schedule, Workflow, WorkflowVersion
from orchestrator.validation import dataset_cycles_of

__all__ = ["SyncReport", "discover", "graph_hash", "sync_workflows", "workflow_modules"]


@dataclass
class SyncReport:
    created: list[str] = field(default_factory=list)
    new_versions: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    broken: dict[str, str] = field(default_factory=dict)  # workflow (or "workflow (file)" of a duplicate) -> errors
    import_errors: dict[str, str] = field(default_factory=dict)  # module -> error
    removed: list[str] = field(default_factory=list)
    generation: int = 0  # the code generation this sync recorded
    import_seconds: dict[str, float] = field(default_factory=dict)  # module -> how long its import took

    @property
    def ok(self) -> bool:
        return not self.broken and not self.import_errors


def graph_hash(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()


def sync_workflows(directory: Path | None = None, package: str | None = None, now=None,
                   notice: Callable[[str], None] | None = None) -> SyncReport:
    """Import, check every workflow, then write: a value the database cannot hold is reported
    with its workflow, field and value before anything is written, and never stops the others.
    ``notice`` hears, while the imports run, which module is slow (a console's line)."""
    report = SyncReport()
    now = now or clock.now()
    found = discover_all(directory, package, notice)
    report.import_errors = {name: error.splitlines()[0] for name, error in found.failed.items()}
    report.import_seconds = found.seconds

    checked = _check_all(found, report)
    seen = {key for key, _, _, _ in checked}
    for key, definition, module_name, message in checked:
        if message is not None:
            report.broken[key] = message
            _mark_broken(definition.name, module_name, message)
            continue
        try:
            _store(definition, module_name, report, now)
        except DataError as exc:  # a limit the checks above do not know yet: this workflow only
            report.broken[key] = storable(f"workflow {limits.safe_repr(definition.name)} could not be stored: {exc}")
    _mark_failed_modules(found.failed, seen, report)
    with transaction.atomic():
        gone = Workflow.objects.filter(present=True).exclude(name__in=seen)
        report.removed = sorted(gone.values_list("name", flat=True))
        gone.update(present=False, synced_at=now)
        # Code can change without a graph changing: every sync is a new code generation, and the
        # workers replace their children to run the code now on disk.
        report.generation = reload.bump()
    return report


def _check_all(found: Discovery, report: SyncReport) -> list[tuple[str, Definition, str, str | None]]:
    """(report key, definition, module, errors or None) of each workflow that will be written; a
    second definition of a name is reported in ``report.broken`` and written nowhere."""
    claims: dict[str, list[tuple[str, Definition]]] = {}
    for module_name, definitions in found.found.items():
        for definition in definitions:
            claims.setdefault(definition.key, []).append((module_name, definition))
    stored = dict(Workflow.objects.filter(name__in=list(claims)).values_list("name", "module")) if claims else {}
    winners = []
    for key, claimed in claims.items():
        winner = _owner(key, claimed, stored.get(key), found, report)
        if winner is not None:
            winners.append((key, *winner))
    loops = dataset_cycles_of({d.name: (d.produces, d.consumes) for _, d, _ in winners if d.name is not None})
    checked = []
    for key, definition, module_name in winners:
        messages = list(definition.errors)
        if definition.name in loops:
            messages.append(loops[definition.name])
        checked.append((key, definition, module_name, storable("\n".join(messages)) if messages else None))
    return checked


def _owner(key: str, claimed: list[tuple[str, Definition]], stored_module: str | None,
           found: Discovery, report: SyncReport) -> tuple[Definition, str] | None:
    """Which definition of a name is written, as (definition, module); None when the module the
    workflow was stored from failed to import now (it stays the owner, marked broken). Each
    other definition is reported, naming both files."""
    if len(claimed) == 1 and (stored_module not in found.failed or claimed[0][0] == stored_module):
        return claimed[0][1], claimed[0][0]
    files = found.files

    def file_of(module_name):
        return files.get(module_name, module_name)

    owners = [claim for claim in claimed if claim[0] == stored_module]
    if owners:
        owner_module, why = owners[0][0], "the module it was stored from"
    elif stored_module is not None and stored_module in found.failed:
        owner_module, why = stored_module, "the module it was stored from, which failed to import now"
    else:
        owners = [min(claimed, key=lambda claim: (file_of(claim[0]), claimed.index(claim)))]
        owner_module = owners[0][0]
        why = "the first by path: neither was stored before" if stored_module is None else \
            f"the first by path: {stored_module}, which it was stored from, defines it no more"
    for module_name, definition in claimed:
        if owners and definition is owners[0][1]:
            continue
        again = " again" if module_name == owner_module else ""
        report.broken[f"{key} ({file_of(module_name)})"] = storable(
            f"workflow {limits.safe_repr(definition.name if definition.name is not None else key)} is defined{again} in "
            f"{file_of(module_name)} and in {file_of(owner_module)}: {file_of(owner_module)} keeps it ({why}); "
            f"the definition in {file_of(module_name)} is ignored: rename one of them")
    return (owners[0][1], owners[0][0]) if owners else None


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
def _store(definition: Definition, module_name: str, report: SyncReport, now) -> None:
    spec = definition.spec
    digest = graph_hash(spec)
    workflow, created = Workflow.objects.select_for_update().get_or_create(
        name=definition.name, defaults={"module": module_name}
    )
    version = workflow.versions.filter(hash=digest).first()
    if version is None:
        number = (workflow.versions.order_by("-number").values_list("number", flat=True).first() or 0) + 1
        version = WorkflowVersion.objects.create(workflow=workflow, number=number, hash=digest, spec=spec)
        (report.created if created else report.new_versions).append(definition.name)
    elif workflow.current_version_id != version.pk or workflow.broken:
        report.new_versions.append(definition.name)
    else:
        report.unchanged.append(definition.name)

    fields = {"module": module_name, **definition.fields, "current_version": version, "broken": False,
              "sync_error": "", "present": True}
    changed = [key for key, value in fields.items() if getattr(workflow, key) != value]
    if changed:
        for key in changed:
            setattr(workflow, key, fields[key])
        workflow.synced_at = now
        workflow.save(update_fields=[*changed, "synced_at", "updated_at"])
    _sync_schedules(workflow, definition, now)


def _sync_schedules(workflow: Workflow, definition: Definition, now) -> None:
    """Code-declared schedules follow the code; schedules made in the admin are never touched."""
    declared = dict(definition.schedules)
    existing = {s.name: s for s in workflow.schedules.filter(source=Schedule.Source.CODE)}
    for name, values in declared.items():
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
