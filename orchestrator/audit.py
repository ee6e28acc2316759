"""The audit log: every operator action, recorded with who, when, what and from where.

Each place where a person acts (a web view, an API view, an admin action, a management command)
calls :func:`record` once the action is done:

    from orchestrator import audit
    audit.record("cancel", request=request, source="ui", target=run, reason=reason)

``action`` is a short verb (``trigger``, ``cancel``, ``retry``, ``discard``, ``pause``,
``resume``, ``backfill``, ``enqueue``, ``limit``, ...); ``target`` a model instance (or give
``target_type`` and ``target_id``); any other keyword is stored as the event's JSON ``detail``.
The record is written in the caller's transaction, so an action that rolls back leaves no
record. Retention never deletes audit events.
"""

from __future__ import annotations

import getpass
import ipaddress
import os

from django.conf import settings

from orchestrator import access, clock, limits
from orchestrator.models import AuditEvent, Run, TaskRun

SOURCES = {choice.value for choice in AuditEvent.Source}


def client_ip(request) -> str | None:
    """The address the request came from. Behind the HTTPS proxy (``BEHIND_HTTPS_PROXY``) it is
    the last address the proxy added to X-Forwarded-For: earlier ones are the client's to forge."""

    if request is None:
        return None
    address = request.META.get("REMOTE_ADDR", "")
    if getattr(settings, "SECURE_PROXY_SSL_HEADER", None):
        forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
        if forwarded:
            address = forwarded[-1]
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return None


def source_of(request) -> str:
    """ui, api or admin, from the URL namespace that served the request."""
    match = getattr(request, "resolver_match", None)
    namespaces = set(match.namespaces) if match else set()
    if "api" in namespaces:
        return AuditEvent.Source.API
    if "admin" in namespaces:
        return AuditEvent.Source.ADMIN
    return AuditEvent.Source.UI


def _target(target, target_type: str, target_id) -> tuple[str, str, str]:
    if target is None:
        return target_type, "" if target_id is None else str(target_id), ""
    try:
        label = str(target).replace("\x00", "")[:300]
    except Exception:  # noqa: BLE001 - a label is a nicety; the record must be written
        label = ""
    return (target_type or target._meta.model_name, str(target.pk), label)


def _owner(target) -> tuple[str, str]:
    """The target's tenant and workflow, so that its tenant's operators read the record ("" when
    it has none: a limit, a user; such records are for global operators)."""
    if target is None:
        return "", ""
    try:
        tenant, workflow = access.owner(target)
    except TypeError:
        return "", ""
    return (tenant or "")[:200], (workflow or "")[:200]


def _owners(target_type: str, ids: list[str]) -> dict[str, tuple[str, str]]:
    """{id: (tenant, workflow)} of the runs or task runs of a bulk action, in one query."""
    model = {"run": Run, "taskrun": TaskRun}.get(target_type)
    numbers = [int(i) for i in ids if i.isdigit()]
    if model is None or not numbers:
        return {}
    name = "workflow__name" if model is Run else "run__workflow__name"
    return {str(pk): (tenant, workflow or "") for pk, tenant, workflow in
            model.objects.filter(pk__in=numbers).values_list("pk", "tenant", name)}


def _detail(detail: dict) -> dict:
    """The detail as JSON can store it; a value it cannot hold is kept as its repr."""
    return {key: value if limits.json_problem(value) is None else limits.safe_repr(value, 500)
            for key, value in detail.items()}


def cli_user() -> str:
    """Who runs a management command: the operating-system user."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def record(action: str, *, request=None, user=None, source: str | None = None, target=None,
           target_type: str = "", target_id=None, actor_name: str | None = None, **detail) -> AuditEvent:
    """Record one operator action; returns the event. Without a request the source is the
    command line and the actor the operating-system user, unless given."""
    user = user if user is not None else getattr(request, "user", None)
    if user is not None and not getattr(user, "is_authenticated", False):
        user = None
    source = source or (source_of(request) if request is not None else AuditEvent.Source.CLI)
    if actor_name is None:
        actor_name = user.get_username() if user is not None else (cli_user() if source == "cli" else "")
    if source not in SOURCES:
        raise ValueError(f"audit source must be one of {', '.join(sorted(SOURCES))}, got {source!r}")
    kind, ident, label = _target(target, target_type, target_id)
    tenant, workflow = _owner(target)
    return AuditEvent.objects.create(
        at=clock.now(), actor=user, actor_name=actor_name[:150],
        action=action[:50], source=source, ip=client_ip(request), target_type=kind[:50], target_id=ident[:255],
        target_label=label, detail=_detail(detail), tenant=tenant, workflow=workflow,
    )


def record_each(action: str, target_type: str, ids, **options) -> list[AuditEvent]:
    """One event per id (a bulk retry or discard), so each task run's history shows it;
    ``options`` as for :func:`record`."""
    first = record(action, target_type=target_type, **options)
    first_id, *others = [str(i) for i in ids] or [""]
    owners = _owners(target_type, [first_id, *others])
    tenant, workflow = owners.get(first_id, ("", ""))
    AuditEvent.objects.filter(pk=first.pk).update(target_id=first_id[:255], tenant=tenant, workflow=workflow)
    if not others:
        return [first]
    copies = [AuditEvent(at=first.at, actor=first.actor, actor_name=first.actor_name, action=first.action,
                         source=first.source, ip=first.ip, target_type=first.target_type, target_id=ident[:255],
                         detail=first.detail, tenant=owners.get(ident, ("", ""))[0],
                         workflow=owners.get(ident, ("", ""))[1]) for ident in others]
    return [first, *AuditEvent.objects.bulk_create(copies)]


class AdminChanges:
    """Adding, changing and deleting through the admin is written to the audit log (as
    ``action``, e.g. "limit"), besides Django's own admin history."""

    audit_action = "change"

    def log_addition(self, request, obj, message):
        record(self.audit_action, request=request, target=obj, change="added", now=_fields(obj))
        return super().log_addition(request, obj, message)

    def log_change(self, request, obj, message):
        record(self.audit_action, request=request, target=obj, change="changed", now=_fields(obj))
        return super().log_change(request, obj, message)

    def log_deletions(self, request, queryset):
        for obj in queryset:
            record(self.audit_action, request=request, target=obj, change="deleted", was=_fields(obj))
        return super().log_deletions(request, queryset)


def _fields(obj) -> dict:
    return {f.name: f.value_from_object(obj) for f in obj._meta.concrete_fields if not f.primary_key
            and not f.is_relation}
