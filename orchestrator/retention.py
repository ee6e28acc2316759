"""Retention: delete finished runs older than a cutoff with their task runs, attempts, logs and
stored results (``orchestrator.results``).

It runs beside live traffic, so it works in batches of short transactions: lock a batch of run
ids with ``FOR UPDATE SKIP LOCKED`` (a run someone else is touching is left for next time),
delete the children first, commit, then delete the batch's log files. ``lock_timeout`` bounds
how long a batch may wait for a row lock; when it is hit, the batch is rolled back and pruning
stops until its next call, rather than queueing behind live work.

Kept regardless of age: active runs (pending, running), and runs that still hold a task in the
dead-letter queue (state ``dead``) or a task that has not finished (a cancelled run whose task
is still being killed): somebody may still retry or inspect them.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import OperationalError, connection, transaction
from django.db.models import CASCADE, DO_NOTHING, SET_NULL

from orchestrator import notifications, results
from orchestrator.clock import system
from orchestrator.conf import log_storage
from orchestrator.models import Attempt, Run, TaskRun
from orchestrator.states import ACTIVE_TASK_STATES, FINISHED_RUN_STATES, TaskState

log = logging.getLogger(__name__)

LOCK_TIMEOUT = "2s"

_AGE_RE = re.compile(r"^\s*(\d+)\s*([dhm])\s*$")
_UNITS = {"d": "days", "h": "hours", "m": "minutes"}


class RetentionError(ValueError):
    pass


def parse_age(text: str) -> timedelta:
    """``30d``, ``12h`` or ``90m`` -> timedelta; anything else raises RetentionError."""
    match = _AGE_RE.match(str(text))
    if not match:
        raise RetentionError(
            f"{text!r} is not an age: use a whole number followed by d (days), h (hours) or m (minutes), e.g. 30d"
        )
    amount, unit = int(match.group(1)), match.group(2)
    if amount <= 0:
        raise RetentionError(f"{text!r} must be more than zero: an age of 0 would delete runs that just finished")
    return timedelta(**{_UNITS[unit]: amount})


@dataclass
class PruneReport:
    cutoff: object = None
    runs: int = 0
    task_runs: int = 0
    attempts: int = 0
    logs: int = 0
    batches: int = 0
    log_errors: list[str] = field(default_factory=list)
    stopped_early: str = ""

    def __str__(self):
        text = (f"pruned {self.runs} runs, {self.task_runs} task runs, {self.attempts} attempts and "
                f"{self.logs} log files finished before {self.cutoff:%Y-%m-%d %H:%M} UTC in {self.batches} batches")
        if self.log_errors:
            text += f"; {len(self.log_errors)} log files could not be deleted"
        if self.stopped_early:
            text += f"; stopped early: {self.stopped_early}"
        return text


# Oldest first, so an interrupted prune has removed the oldest history. run_finished_at indexes
# finished_at; the NOT EXISTS uses the (run, task) unique index.
SELECT_BATCH_SQL = """
    SELECT r.id FROM orchestrator_run r
     WHERE r.state = ANY(%s) AND r.finished_at < %s
       AND NOT EXISTS (SELECT 1 FROM orchestrator_taskrun t WHERE t.run_id = r.id AND t.state = ANY(%s))
     ORDER BY r.finished_at
     LIMIT %s
       FOR UPDATE OF r SKIP LOCKED
"""


def _delete_rows(model, where_sql: str, params: list) -> int:
    """Delete ``model`` rows matching ``where_sql`` after their dependents, in SQL.

    Dependents are found from the model graph, so a model added later that points at a run,
    task run or attempt is handled by its own ``on_delete`` instead of blocking the delete.
    """
    table = model._meta.db_table
    pk = model._meta.pk.column
    for relation in model._meta.related_objects:
        if not relation.field.concrete or relation.many_to_many:
            continue
        related = relation.related_model
        column = relation.field.column
        sub_where = f"{column} IN (SELECT {pk} FROM {table} WHERE {where_sql})"
        on_delete = relation.on_delete
        if on_delete is CASCADE:
            _delete_rows(related, sub_where, params)
        elif on_delete is SET_NULL:
            with connection.cursor() as cursor:
                cursor.execute(f"UPDATE {related._meta.db_table} SET {column} = NULL WHERE {sub_where}", params)
        elif on_delete is not DO_NOTHING:
            # PROTECT, RESTRICT, SET_DEFAULT: let the database refuse rather than guess.
            continue
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE {where_sql}", params)
        return cursor.rowcount


def _prune_batch(cutoff, batch_size: int) -> tuple[int, int, int, list[str]]:
    """One transaction: returns (runs, task runs, attempts) deleted and the log files to delete."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            cursor.execute(SELECT_BATCH_SQL, [
                list(FINISHED_RUN_STATES), cutoff, [TaskState.DEAD, *ACTIVE_TASK_STATES], batch_size,
            ])
            ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return 0, 0, 0, []
        log_paths = list(
            Attempt.objects.filter(task_run__run_id__in=ids).exclude(log_path="").values_list("log_path", flat=True)
        )
        with connection.cursor() as cursor:
            log_paths += results.names_of_runs(cursor, ids)  # results too large for a row, in the same storage
        # Counted before the delete: _delete_rows reports only the top table's row count.
        attempts = Attempt.objects.filter(task_run__run_id__in=ids).count()
        task_runs = TaskRun.objects.filter(run_id__in=ids).count()
        deleted = _delete_rows(Run, "id = ANY(%s)", [ids])
    return deleted, task_runs, attempts, log_paths


def prune(older_than: timedelta, *, batch_size: int = 1000, clock=None, max_batches: int | None = None) -> PruneReport:
    """Delete finished runs whose ``finished_at`` is older than ``older_than`` (see the module doc).

    Each batch is one transaction of at most ``batch_size`` runs; log files are deleted after
    the batch commits (a rolled-back batch keeps its logs). ``max_batches`` caps one call.
    """
    if older_than <= timedelta(0):
        raise RetentionError("older_than must be more than zero")
    if batch_size < 1:
        raise RetentionError("batch_size must be at least 1")
    cutoff = (clock or system).now() - older_than
    report = PruneReport(cutoff=cutoff)
    while max_batches is None or report.batches < max_batches:
        try:
            deleted, task_runs, attempts, log_paths = _prune_batch(cutoff, batch_size)
        except OperationalError as exc:
            # lock_timeout: live work holds a row this batch needs. Try again at the next prune.
            report.stopped_early = str(exc).strip().splitlines()[0]
            log.warning("retention: batch rolled back, stopping: %s", report.stopped_early)
            break
        if deleted == 0:
            break
        report.batches += 1
        report.runs += deleted
        report.task_runs += task_runs
        report.attempts += attempts
        for path in log_paths:
            try:
                log_storage().delete(path)
            except Exception as exc:  # noqa: BLE001 - a storage backend may raise anything; keep pruning
                report.log_errors.append(f"{path}: {exc}")
            else:
                report.logs += 1
        if deleted < batch_size:
            break
    # Notification messages and what they carried (those of pruned runs went with their runs).
    notifications.prune_messages(cutoff)
    log.info("retention: %s", report)
    return report
