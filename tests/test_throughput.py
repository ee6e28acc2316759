"""What a job costs the database when it is created: statements, round trips, rows, wake-ups.
Counted, never timed: one statement (one round trip outside a transaction) for a job's
``create_run``, one statement for N jobs in ``enqueue_many``, idempotency keys decided by the
database within a batch and against stored jobs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from orchestrator.jobs import JobError, enqueue
from orchestrator.models import Run, TaskRun
from orchestrator.states import TaskState

pytestmark = [pytest.mark.django_db, pytest.mark.time_sensitive]

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
REF = "workflows.jobs:send_welcome_email"


class Statements:
    """Every statement sent on the connection, and whether a transaction was open around it."""

    def __init__(self):
        self.sent: list[tuple[str, bool]] = []

    def __call__(self, execute, sql, params, many, context):
        self.sent.append((sql, connection.in_atomic_block))
        return execute(sql, params, many, context)


@pytest.mark.django_db(transaction=True)
def test_a_job_is_created_by_one_statement_in_one_round_trip():
    statements = Statements()
    with connection.execute_wrapper(statements):
        run, created = enqueue(REF, kwargs={"user_id": 1}, now=NOW)
    assert created is True
    # One INSERT … RETURNING in autocommit: no BEGIN, no COMMIT, no second statement.
    assert len(statements.sent) == 1, [sql[:80] for sql, _ in statements.sent]
    assert statements.sent[0][1] is False
    [task_run] = TaskRun.objects.filter(run=run)
    assert (task_run.state, task_run.due_at, task_run.spec["kwargs"]) == (TaskState.SCHEDULED, NOW, {"user_id": 1})


@pytest.mark.django_db(transaction=True)
def test_a_repeated_key_costs_one_more_statement_and_writes_nothing():
    first, _ = enqueue(REF, kwargs={"user_id": 1}, idempotency_key="k", now=NOW)
    statements = Statements()
    with connection.execute_wrapper(statements):
        again, created = enqueue(REF, kwargs={"user_id": 1}, idempotency_key="k", now=NOW)
    assert (created, again.pk) == (False, first.pk)
    assert len(statements.sent) == 2  # the insert the database declined, and the read of the job it kept
    assert (Run.objects.count(), TaskRun.objects.count()) == (1, 1)


def test_the_rows_a_job_writes_at_its_creation_are_its_run_and_its_task_run():
    with CaptureQueriesContext(connection) as queries:
        enqueue(REF, args=[1], now=NOW)
    inserts = [q["sql"] for q in queries.captured_queries if "INSERT" in q["sql"]]
    assert len(inserts) == 1
    assert (Run.objects.count(), TaskRun.objects.count()) == (1, 1)


def test_a_bad_job_is_refused_before_any_statement():
    with CaptureQueriesContext(connection) as queries, pytest.raises(JobError):
        enqueue(REF, run_after=NOW.replace(tzinfo=None) + timedelta(minutes=1), now=NOW)
    assert queries.captured_queries == []
