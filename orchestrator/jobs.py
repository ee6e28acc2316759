"""One-off and delayed jobs: a single registered function, run once (at least once) as soon as
possible or after ``run_after``.

A job is a Run with trigger "job", no workflow and one TaskRun named by the reference, so retries,
the dead-letter queue, logs and the UI serve jobs unchanged. An idempotency key makes enqueueing
safe to retry: the database's unique index on the key decides which of two concurrent requests
creates the job, and the other gets it back (or a conflict, if its payload differs).

    from orchestrator.jobs import enqueue, job

    @job
    def send_welcome_email(user_id): ...

    run, created = enqueue(send_welcome_email, kwargs={"user_id": 42},
                           run_after=timezone.now() + timedelta(minutes=10), idempotency_key="welcome-42")

``enqueue_many([{"ref": ..., "kwargs": ...}, ...])`` enqueues a batch: every item checked first,
then the whole batch inserted by one statement, idempotency keys answered as ``enqueue`` does.

Only registered functions can be jobs (see ``orchestrator.registry``): a reference given by name
(the API's ``ref``) is looked up, never imported.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import signals
from django.db.models.base import ModelState
from django.utils import timezone

from orchestrator import clock, limits, registry, retries, tracing
from orchestrator import secrets as _secrets
from orchestrator.models import Run
from orchestrator.retries import RetryPolicy
from orchestrator.runs import (
    RUN_CHUNK,
    IdempotencyConflict,
    NewRun,
    RunError,
    create_run,
    insert_new_runs,
    payload_hash,
)
from orchestrator.states import RunState, Trigger

__all__ = ["IdempotencyConflict", "JobError", "RetryPolicy", "enqueue", "enqueue_many", "job", "job_ref", "job_spec"]


def job(fn=None, /, *, executor: str = "process", secrets: Iterable[str] | dict | None = None,
        connections: Iterable[str] | dict | None = None):
    """Decorator: ``@job`` lets the API, the admin and ``enqueue()`` run this function as a job
    (see ``orchestrator.registry.job`` for ``executor``). ``secrets`` and ``connections`` name
    what it may read while it runs (``orchestrator.secrets.secret(name)``, ``connection(name)``)."""
    declared = {"secrets": secrets, "connections": connections}

    def decorate(func):
        func = registry.job(func, executor=executor)
        try:
            _secrets.declare_job(registry.ref_of(func), **declared)
        except ValueError as exc:
            raise TypeError(f"@job(secrets=..., connections=...) of {registry.ref_of(func)}: {exc}") from None
        return func

    return decorate(fn) if fn is not None else decorate


class JobError(RunError):
    """Bad enqueue input; ``field`` names the argument at fault."""


def job_ref(target) -> str:
    """The reference of a registered job, given by name or as the registered object itself.
    Raises JobError(field="ref") for anything the project did not register; imports nothing."""
    if isinstance(target, str):
        try:
            return registry.check_enqueue(target)
        except registry.NotRegistered as exc:
            raise JobError(str(exc), field="ref") from None
    if not callable(target):
        raise JobError(f"ref must be a registered function or its 'package.module:function' name, "
                       f"got {limits.safe_repr(target)}", field="ref")
    ref = registry.ref_of(target)
    found = registry.get(ref)
    if found is not target and getattr(found, "func", None) is not getattr(target, "func", target):
        raise JobError(f"{ref} is not a registered job: decorate it with @job (orchestrator.jobs.job) in a "
                       "module every process imports (a jobs module of an installed app, or one named in "
                       "ORCHESTRATOR_JOB_MODULES)", field="ref")
    return ref


def _json(value, field: str):
    problem = limits.json_problem(value)
    if problem:
        raise JobError(f"{field} must be JSON-serialisable: {problem}", field=field)
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise JobError(f"{field} must be JSON-serialisable: {exc}", field=field) from None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _call(args, kwargs) -> tuple[list, dict]:
    """The call's arguments, as JSON will store them."""
    if isinstance(args, str | bytes) or not isinstance(args, list | tuple):
        raise JobError(f"args must be a list or tuple, got {type(args).__name__}", field="args")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict) or not all(isinstance(key, str) for key in kwargs):
        raise JobError("kwargs must be a dict with string keys", field="kwargs")
    if not args and not kwargs:
        return [], {}  # what the JSON round trip below would give, without it
    return _json(list(args), "args"), _json(kwargs, "kwargs")


def _check_run_after(run_after) -> None:
    if run_after is None:
        return
    if not isinstance(run_after, datetime):
        raise JobError(f"run_after must be a datetime, got {type(run_after).__name__}", field="run_after")
    if timezone.is_naive(run_after):
        raise JobError(f"run_after must be timezone-aware, got naive {run_after.isoformat()} "
                       f"(add a timezone, e.g. +00:00)", field="run_after")


def _check_placement(queue, priority, tenant) -> None:
    """Where the job waits: its queue, priority and tenant."""
    if not isinstance(queue, str) or not limits.QUEUE_RE.match(queue):
        raise JobError(f"queue must be letters, digits, '_', '-' or '.', got {limits.safe_repr(queue)}",
                       field="queue")
    if not _is_int(priority) or not limits.PRIORITY_MIN <= priority <= limits.PRIORITY_MAX:
        raise JobError(f"priority must be a whole number from {limits.PRIORITY_MIN} to {limits.PRIORITY_MAX}, "
                       f"got {limits.safe_repr(priority)}", field="priority")
    if limits.text_problem(tenant, limits.TENANT, allow_empty=False):
        raise JobError(f"tenant must be a non-empty string of at most {limits.TENANT} characters, "
                       f"got {limits.safe_repr(tenant)}", field="tenant")


def _policy(retry, max_attempts, spec_extra: dict) -> RetryPolicy:
    """The job's retry policy: ``retry`` (the default policy when None), its attempts replaced by
    ``max_attempts`` when given, its values by those ``spec_extra`` names; each value checked."""
    if retry is None:
        if max_attempts is None and not any(key in spec_extra for key in retries.SPEC_KEYS.values()):
            return retries.DEFAULT  # valid as it is: what the checks below would answer
        retry = retries.DEFAULT
    elif not isinstance(retry, RetryPolicy):
        raise JobError(f"retry must be an orchestrator.retries.RetryPolicy, got {limits.safe_repr(retry)}",
                       field="retry")
    values = {**retry.spec(), **({} if max_attempts is None else {"max_attempts": max_attempts}),
              **{key: spec_extra[key] for key in retries.SPEC_KEYS.values() if key in spec_extra}}
    for key, value in values.items():
        if message := retries.problem(key, value):
            raise JobError(f"{key} {message}, got {limits.safe_repr(value)}", field=key)
    return RetryPolicy.of(values)


def _check_timeout(timeout) -> None:
    if timeout is not None and (limits.number_problem(timeout) or timeout <= 0):
        raise JobError(f"timeout must be a positive number of seconds or None, got {limits.safe_repr(timeout)}",
                       field="timeout")


def _check_key(idempotency_key) -> None:
    if idempotency_key is not None and limits.text_problem(idempotency_key, 255, allow_empty=False):
        raise JobError("idempotency_key must be a non-empty string of at most 255 characters",
                       field="idempotency_key")


def _extra(spec_extra) -> dict:
    if spec_extra is not None and not isinstance(spec_extra, dict):
        raise JobError(f"spec_extra must be a dict, got {type(spec_extra).__name__}", field="spec_extra")
    return _json(spec_extra, "spec_extra") if spec_extra else {}


def job_spec(ref: str, *, args=(), kwargs: dict | None = None, queue: str = "default", priority: int = 0,
             tenant: str = "default", max_attempts: int | None = None, retry: RetryPolicy | None = None,
             timeout: float | None = None, spec_extra: dict | None = None) -> dict:
    """The checked spec of a job's one task (every check of ``enqueue`` but the reference's, which
    the caller makes): what ``enqueue`` and the callbacks (``callbacks.enqueue_calls``) insert.
    Raises JobError naming the argument at fault."""
    args, kwargs = _call(args, kwargs)
    _check_placement(queue, priority, tenant)
    _check_timeout(timeout)
    spec_extra = _extra(spec_extra)
    policy = _policy(retry, max_attempts, spec_extra)
    # spec_extra adds to the spec; it never replaces what was checked (the reference above all).
    return {**spec_extra, "kind": "python", "ref": ref, "call": "job", "args": args, "kwargs": kwargs,
            "timeout": timeout, "upstream": [], "queue": queue, **policy.spec()}


def enqueue(
    ref,
    *,
    args=(),
    kwargs: dict | None = None,
    run_after: datetime | None = None,
    queue: str = "default",
    priority: int = 0,
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
    retry: RetryPolicy | None = None,
    timeout: float | None = None,
    tenant: str = "default",
    created_by=None,
    spec_extra: dict | None = None,
    now: datetime | None = None,
) -> tuple[Run, bool]:
    """Enqueue ``ref(*args, **kwargs)`` as a job; returns (run, created). ``ref`` is a registered
    function (or task) or its ``package.module:function`` name.

    ``retry`` is the retry policy (``orchestrator.retries.RetryPolicy``; by default one attempt,
    and a workflow task's timing); ``max_attempts``, when given, replaces its number of attempts.

    The same idempotency key with the same payload returns the existing job (created=False); with a
    different payload it raises IdempotencyConflict. The payload is the call and its options (ref,
    args, kwargs, queue, priority, retry policy, timeout, tenant, spec_extra) but not ``run_after``,
    so a client retrying "in ten minutes" a little later gets the job it already made.
    """
    prepared = _prepare(ref, args=args, kwargs=kwargs, run_after=run_after, queue=queue, priority=priority,
                        idempotency_key=idempotency_key, max_attempts=max_attempts, retry=retry, timeout=timeout,
                        tenant=tenant, spec_extra=spec_extra)
    now = now or clock.now()
    when = prepared.run_after or now
    return create_run(
        None, trigger=Trigger.JOB, tasks={prepared.ref: prepared.spec}, logical_date=when, due_at=when,
        priority=priority, tenant=tenant, idempotency_key=idempotency_key, request_payload=prepared.payload,
        created_by=created_by, now=now,
    )


@dataclass
class _Prepared:
    ref: str
    spec: dict
    payload: dict | None  # what the idempotency key stands for (None without a key)
    run_after: datetime | None
    priority: int
    tenant: str
    idempotency_key: str | None


def _prepare(ref, *, args=(), kwargs=None, run_after=None, queue="default", priority=0, idempotency_key=None,
             max_attempts=None, retry=None, timeout=None, tenant="default", spec_extra=None) -> _Prepared:
    """One job's checked reference, spec and idempotency payload; JobError names the argument at fault."""
    ref = job_ref(ref)
    _check_run_after(run_after)
    _check_key(idempotency_key)
    spec = job_spec(ref, args=args, kwargs=kwargs, queue=queue, priority=priority, tenant=tenant,
                    max_attempts=max_attempts, retry=retry, timeout=timeout, spec_extra=spec_extra)
    payload = None
    if idempotency_key is not None:
        payload = {"ref": ref, "args": spec["args"], "kwargs": spec["kwargs"], "queue": queue, "priority": priority,
                   "max_attempts": spec["max_attempts"], "timeout": timeout, "tenant": tenant,
                   "spec_extra": _extra(spec_extra)}
        if retry is not None:
            payload["retry"] = retry.spec()
    return _Prepared(ref, spec, payload, run_after, priority, tenant, idempotency_key)


# What each item of enqueue_many may name: enqueue's arguments but who and when.
ITEM_KEYS = frozenset({"ref", "args", "kwargs", "run_after", "queue", "priority", "idempotency_key", "max_attempts",
                       "retry", "timeout", "tenant", "spec_extra"})


def enqueue_many(items, *, created_by=None, now: datetime | None = None) -> list[tuple[Run, bool]]:
    """Enqueue many jobs: ``items`` is a list of dicts of ``enqueue``'s arguments (``ref`` and any of
    ``ITEM_KEYS``). Returns (run, created) per item, in order.

    Every item is checked before anything is written (JobError names the item, e.g.
    ``jobs[3].queue``). The runs and task runs of the whole batch are inserted by one statement
    (``runs.insert_new_runs``, up to ``runs.RUN_CHUNK`` jobs each). Idempotency keys keep their
    meaning: an item whose key an earlier item of the batch or a stored job holds gets that job
    back (created=False) when its payload is the same; a different payload refuses the whole batch
    (a JobError within the batch before any statement; IdempotencyConflict against a stored job,
    the batch rolled back), so a client can retry a batch as a whole."""
    prepared = _checked_items(items)
    same_as = _repeated_keys(prepared)
    now = now or clock.now()
    entries = {index: _new_run(item, now, created_by) for index, item in enumerate(prepared) if index not in same_as}
    keyed = any(item.idempotency_key for item in prepared)
    # Without keys nothing can conflict: each statement stands alone. With keys, a conflict found
    # after the insert undoes the batch.
    with transaction.atomic() if keyed else contextlib.nullcontext():
        created = _insert_entries(entries, now)
    for index, entry in entries.items():
        if index in created:
            tracing.enqueued(entry.run, entry.tasks)
    return [(entries[same_as.get(index, index)].run, index in created) for index in range(len(prepared))]


def _checked_items(items) -> list[_Prepared]:
    """Each item checked as ``enqueue`` checks its arguments; JobError names the item at fault."""
    if isinstance(items, dict | str | bytes) or not hasattr(items, "__iter__"):
        raise JobError(f"jobs must be a list of dicts, got {type(items).__name__}", field="jobs")
    prepared: list[_Prepared] = []
    for index, item in enumerate(items):
        where = f"jobs[{index}]"
        if not isinstance(item, dict):
            raise JobError(f"{where} must be a dict of enqueue's arguments, got {type(item).__name__}", field=where)
        if not ITEM_KEYS.issuperset(item):
            unknown = sorted(str(key) for key in item if key not in ITEM_KEYS)
            raise JobError(f"{where} has unknown argument(s) {', '.join(unknown)}; "
                           f"allowed: {', '.join(sorted(ITEM_KEYS))}", field=where)
        if "ref" not in item:
            raise JobError(f"{where} needs a ref", field=f"{where}.ref")
        try:
            prepared.append(_prepare(**item))
        except JobError as exc:
            raise JobError(f"{where}: {exc}", field=f"{where}.{exc.field}") from None
    return prepared


def _repeated_keys(prepared: list[_Prepared]) -> dict[int, int]:
    """The items that repeat an earlier item's key with the same request: {index: earlier index}.
    The same key with another request refuses the batch (JobError)."""
    first_of_key: dict[str, int] = {}
    same_as: dict[int, int] = {}
    for index, item in enumerate(prepared):
        if item.idempotency_key is None:
            continue
        earlier = first_of_key.setdefault(item.idempotency_key, index)
        if earlier == index:
            continue
        if payload_hash(prepared[earlier].payload) != payload_hash(item.payload):
            raise JobError(f"jobs[{index}]: idempotency key {item.idempotency_key!r} is also the key of "
                           f"jobs[{earlier}], with a different request", field=f"jobs[{index}].idempotency_key")
        same_as[index] = earlier
    return same_as


def _new_run(item: _Prepared, now: datetime, created_by) -> NewRun:
    when = item.run_after or now
    run = _run_instance(logical_date=when, trigger=Trigger.JOB, params={}, tenant=item.tenant, priority=item.priority,
                        state=RunState.RUNNING, idempotency_key=item.idempotency_key,
                        payload_hash=payload_hash(item.payload) if item.payload is not None else "")
    if created_by is not None:
        run.created_by = created_by
    return NewRun(run, tracing.new_run({item.ref: item.spec}), when, admitted=True)


def _run_instance(**values) -> Run:
    """``Run(**values)``, built as Django builds an instance but without its per-field work: the
    instance's attributes are the fields' defaults (``_run_defaults``) with ``values`` over them.
    ``Model.__init__`` looks up and sets each of the run's two dozen fields one by one, through
    their descriptors: for a batch of 500 jobs that cost more than its statement. With a receiver
    of ``pre_init`` or ``post_init`` for Run, the plain constructor, which sends them."""
    if signals.pre_init.has_listeners(Run) or signals.post_init.has_listeners(Run):
        return Run(**values)
    constant, made = _run_defaults()
    run = Run.__new__(Run)
    attributes = run.__dict__
    attributes["_state"] = ModelState()
    attributes.update(constant)
    for field in made:
        if field.attname not in values:
            attributes[field.attname] = field.get_default()
    attributes.update(values)
    return run


@functools.cache
def _run_defaults() -> tuple[dict, tuple]:
    """A new Run's fields' defaults: the constant ones by attribute (an enum, a number, a string or
    None: shared safely), and the fields whose default is made anew for each instance (a callable:
    ``params``' dict)."""
    fields = Run._meta.concrete_fields
    made = tuple(f for f in fields if f.has_default() and callable(f.default))
    return {f.attname: f.get_default() for f in fields if f not in made}, made


def _insert_entries(entries: dict[int, NewRun], now: datetime) -> set[int]:
    """Insert the batch; the indexes of the items created. An item the database declined takes the
    stored job of its key, or raises IdempotencyConflict when that job's request differs."""
    order = list(entries.values())
    made: set[int] = set()
    for start in range(0, len(order), RUN_CHUNK):
        made.update(id(entry) for entry in insert_new_runs(order[start:start + RUN_CHUNK], now))
    created = {index for index, entry in entries.items() if id(entry) in made}
    missing = [index for index in entries if index not in created]
    if not missing:
        return created
    existing = {run.idempotency_key: run for run in Run.objects.filter(
        idempotency_key__in=[entries[index].run.idempotency_key for index in missing])}
    for index in missing:
        entry = entries[index]
        found = existing.get(entry.run.idempotency_key)
        if found is None:  # only a key can make the database decline a job's run
            raise JobError(f"jobs[{index}] was not created and no job holds its key", field=f"jobs[{index}]")
        if found.payload_hash and found.payload_hash != entry.run.payload_hash:
            conflict = IdempotencyConflict(entry.run.idempotency_key, found)
            conflict.field = f"jobs[{index}].idempotency_key"
            raise conflict
        entry.run = found
    return created
