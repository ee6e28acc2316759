"""One-off and delayed jobs: a single task, named by reference, run once (at least once) as soon as
possible or after ``run_after``.

A job is a Run with trigger "job", no workflow and one TaskRun named by the reference, so retries,
the dead-letter queue, logs and the UI serve jobs unchanged. An idempotency key makes enqueueing
safe to retry: the database's unique index on the key decides which of two concurrent requests
creates the job, and the other gets it back (or a conflict, if its payload differs).

    from orchestrator.jobs import enqueue
    run, created = enqueue("workflows.jobs:send_welcome_email", kwargs={"user_id": 42},
                           run_after=timezone.now() + timedelta(minutes=10), idempotency_key="welcome-42")
"""

from __future__ import annotations

import importlib
import json
import re
from datetime import datetime

from django.utils import timezone

from orchestrator.models import Run, Trigger
from orchestrator.runs import IdempotencyConflict, RunError, create_run

__all__ = ["IdempotencyConflict", "JobError", "enqueue", "resolve_ref"]

REF_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
QUEUE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")

# Retry timing of a job's attempts, the same defaults as a workflow task's; spec_extra overrides.
RETRY_DEFAULTS = {"retry_delay": 10.0, "retry_backoff": 2.0, "retry_max_delay": 3600.0}


class JobError(RunError):
    """Bad enqueue input; ``field`` names the argument at fault."""


def resolve_ref(ref: object):
    """Import "package.module:function" (the attribute may be dotted) and return the callable, or
    raise JobError(field="ref") saying what is wrong."""
    if not isinstance(ref, str) or not REF_RE.match(ref):
        raise JobError(f"ref must look like 'package.module:function', got {ref!r}", field="ref")
    module_name, _, attribute = ref.partition(":")
    try:
        target = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise JobError(f"cannot import module {module_name!r} of ref {ref!r}: {exc}", field="ref") from None
    except Exception as exc:  # noqa: BLE001 - user code failing at import is reported, not raised
        raise JobError(f"importing module {module_name!r} of ref {ref!r} failed: "
                       f"{type(exc).__name__}: {exc}", field="ref") from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise JobError(f"module {module_name!r} has no attribute {attribute!r} (ref {ref!r})",
                           field="ref") from None
    if not callable(target):
        raise JobError(f"ref {ref!r} names a {type(target).__name__}, not a function", field="ref")
    return target


def _json(value, field: str):
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise JobError(f"{field} must be JSON-serialisable: {exc}", field=field) from None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def enqueue(
    ref: str,
    *,
    args=(),
    kwargs: dict | None = None,
    run_after: datetime | None = None,
    queue: str = "default",
    priority: int = 0,
    idempotency_key: str | None = None,
    max_attempts: int = 1,
    timeout: float | None = None,
    tenant: str = "default",
    created_by=None,
    spec_extra: dict | None = None,
    now: datetime | None = None,
) -> tuple[Run, bool]:
    """Enqueue ``ref(*args, **kwargs)`` as a job; returns (run, created).

    The same idempotency key with the same payload returns the existing job (created=False); with a
    different payload it raises IdempotencyConflict. The payload is the call and its options (ref,
    args, kwargs, queue, priority, max_attempts, timeout, tenant, spec_extra) but not ``run_after``,
    so a client retrying "in ten minutes" a little later gets the job it already made.
    """
    resolve_ref(ref)
    if isinstance(args, str | bytes) or not isinstance(args, list | tuple):
        raise JobError(f"args must be a list or tuple, got {type(args).__name__}", field="args")
    args = _json(list(args), "args")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict) or not all(isinstance(key, str) for key in kwargs):
        raise JobError("kwargs must be a dict with string keys", field="kwargs")
    kwargs = _json(kwargs, "kwargs")
    if run_after is not None:
        if not isinstance(run_after, datetime):
            raise JobError(f"run_after must be a datetime, got {type(run_after).__name__}", field="run_after")
        if timezone.is_naive(run_after):
            raise JobError(f"run_after must be timezone-aware, got naive {run_after.isoformat()} "
                           f"(add a timezone, e.g. +00:00)", field="run_after")
    if not isinstance(queue, str) or not QUEUE_RE.match(queue):
        raise JobError(f"queue must be letters, digits, '_', '-' or '.', got {queue!r}", field="queue")
    if not _is_int(priority) or not -100 <= priority <= 100:
        raise JobError(f"priority must be a whole number from -100 to 100, got {priority!r}", field="priority")
    if not _is_int(max_attempts) or max_attempts < 1:
        raise JobError(f"max_attempts must be a whole number of at least 1, got {max_attempts!r}",
                       field="max_attempts")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
        raise JobError(f"timeout must be a positive number of seconds or None, got {timeout!r}", field="timeout")
    if not isinstance(tenant, str) or not tenant.strip() or len(tenant) > 200:
        raise JobError(f"tenant must be a non-empty string of at most 200 characters, got {tenant!r}",
                       field="tenant")
    if idempotency_key is not None and (
            not isinstance(idempotency_key, str) or not idempotency_key.strip() or len(idempotency_key) > 255):
        raise JobError("idempotency_key must be a non-empty string of at most 255 characters",
                       field="idempotency_key")
    if spec_extra is not None and not isinstance(spec_extra, dict):
        raise JobError(f"spec_extra must be a dict, got {type(spec_extra).__name__}", field="spec_extra")
    spec_extra = _json(spec_extra or {}, "spec_extra")

    spec = {
        "kind": "python", "ref": ref, "call": "job", "args": args, "kwargs": kwargs, "timeout": timeout,
        **RETRY_DEFAULTS, "upstream": [], "queue": queue, "max_attempts": max_attempts, **spec_extra,
    }
    payload = {"ref": ref, "args": args, "kwargs": kwargs, "queue": queue, "priority": priority,
               "max_attempts": max_attempts, "timeout": timeout, "tenant": tenant, "spec_extra": spec_extra}
    now = now or timezone.now()
    when = run_after or now
    return create_run(
        None, trigger=Trigger.JOB, tasks={ref: spec}, logical_date=when, due_at=when, priority=priority,
        tenant=tenant, idempotency_key=idempotency_key, request_payload=payload if idempotency_key else None,
        created_by=created_by, now=now,
    )
