"""A worker's batch on the wire: its transaction begins in its pipeline (``db.atomic``), a batch
that only claims is one round trip and one that records outcomes two, its COMMIT never ends a
caller's transaction, and a batch that fails commits nothing and leaves the connection idle.
Counted, never timed: the times the worker waits for the server's answers."""

from __future__ import annotations

from unittest import mock

import pytest
from django.db import connection

from orchestrator.jobs import enqueue_many
from orchestrator.models import TaskRun
from orchestrator.states import TaskState
from tests.support.sent import Sent

REF = "workflows.jobs:send_welcome_email"


@pytest.mark.django_db(transaction=True)
def test_a_batch_sends_its_commit_in_its_pipeline_and_never_commits_a_callers_transaction(clock):
    """A worker's batch ends with its COMMIT in the pipeline (the closing sync carries it: one round
    trip fewer than a commit after the pipeline). Run inside a caller's transaction, it commits
    nothing: the caller's rollback undoes its claim."""
    from django.db import transaction

    from orchestrator.worker import Worker

    enqueue_many([{"ref": REF, "kwargs": {"user_id": n}} for n in range(4)], now=clock.now())
    loop = Worker(["default"], concurrency=4)
    loop.register()
    with Sent() as sent:
        assert len(loop.batch.flush(claim=2)) == 2
    assert sent.sql[-1] == "COMMIT"
    assert not connection.in_atomic_block and connection.connection.info.transaction_status == 0  # idle
    with transaction.atomic():
        with Sent() as inside:
            assert len(loop.batch.flush(claim=2)) == 2
        assert "COMMIT" not in inside.sql
        transaction.set_rollback(True)
    assert TaskRun.objects.filter(state=TaskState.RUNNING).count() == 2
    assert TaskRun.objects.filter(state=TaskState.SCHEDULED).count() == 2


class Answers:
    """How many times a block waits for the server's answers in a pipeline, each a round trip: a
    Sync (the end of a pipeline, or psycopg's own BEGIN, whose answer it awaits before anything
    else is sent), or the read of a result that is not there yet (a flush request)."""

    def __enter__(self):
        from psycopg import Cursor
        from psycopg._pipeline_base import BasePipeline

        self.count = 0
        sync, fetch = BasePipeline._enqueue_sync, Cursor._fetch_pipeline

        def counted_sync(pipeline):
            self.count += 1
            return sync(pipeline)

        def counted_fetch(cursor):
            if cursor._conn._pipeline and not cursor.pgresult:
                self.count += 1
            return fetch(cursor)

        self._patches = [mock.patch.object(BasePipeline, "_enqueue_sync", counted_sync),
                         mock.patch.object(Cursor, "_fetch_pipeline", counted_fetch)]
        for patch in self._patches:
            patch.start()
        return self

    def __exit__(self, *exc):
        for patch in self._patches:
            patch.stop()


@pytest.mark.django_db(transaction=True)
def test_a_batch_is_one_round_trip_unless_an_outcome_s_answer_may_call_for_more(clock):
    """The batch's BEGIN goes in its pipeline (db.atomic), not as psycopg's own, whose answer it
    would wait for. A batch whose answers can call for no statement (a claim, plain jobs'
    successes) sends its COMMIT with them and reads the answers after the pipeline's end: one
    round trip. Other outcomes' answers may call for more (a retry's wake-up, children to
    release, callbacks), so such a batch reads them first and commits in a second round trip."""
    from orchestrator.models import Attempt, Run
    from orchestrator.resolver import Ending
    from orchestrator.states import AttemptOutcome, RunState
    from orchestrator.worker import Worker

    enqueue_many([{"ref": REF, "kwargs": {"user_id": n}} for n in range(6)], now=clock.now())
    loop = Worker(["default"], concurrency=6)
    loop.register()
    loop.batch.current_limits()
    with Answers() as answers, Sent() as sent:
        claimed = loop.batch.flush(claim=2)
    assert len(claimed) == 2 and answers.count == 1
    assert sent.sql[0] == "BEGIN" and sent.sql[-1] == "COMMIT"
    assert not connection.in_atomic_block and connection.connection.info.transaction_status == 0  # idle
    assert connection.get_autocommit() and connection.connection.autocommit
    # Committed: another connection sees the claim.
    assert other_connection_count("SELECT count(*) FROM orchestrator_taskrun WHERE state = 'running'") == 2

    def ended(message, outcome, **fields):
        return Ending(message["id"], message["number"], outcome, job=True, run_id=message["run_id"],
                      plain=message["spec"].get("call") == "job", **fields)

    for message in claimed:  # what Worker.child_replied makes of a job's success
        loop.batch.add(ended(message, AttemptOutcome.SUCCEEDED, result="null"))
    with Answers() as answers:
        claimed = loop.batch.flush(claim=2)
    assert len(claimed) == 2 and answers.count == 1
    assert other_connection_count("SELECT count(*) FROM orchestrator_run WHERE state = 'succeeded'") == 2
    assert other_connection_count("SELECT count(*) FROM orchestrator_taskrun WHERE state = 'running'") == 2
    # A failure: its answer may call for a retry's wake-up, read before the commit.
    loop.batch.add(ended(claimed[0], AttemptOutcome.FAILED, error="boom"))
    loop.batch.add(ended(claimed[1], AttemptOutcome.SUCCEEDED, result="null"))
    with Answers() as answers:
        assert len(loop.batch.flush(claim=2)) == 2
    assert answers.count == 2
    assert other_connection_count("SELECT count(*) FROM orchestrator_run WHERE state IN ('succeeded', 'failed')") == 4
    assert Run.objects.filter(state=RunState.RUNNING).count() == 2
    assert Attempt.objects.filter(outcome=AttemptOutcome.FAILED).count() == 1
    # A success that is not a plain job's (callbacks, datasets, a workflow's task) is read first too.
    for message in TaskRun.objects.filter(state=TaskState.RUNNING).values("id", "attempts", "run_id"):
        loop.batch.add(Ending(message["id"], message["attempts"], AttemptOutcome.SUCCEEDED, result="null",
                              job=True, run_id=message["run_id"], plain=False))
    with Answers() as answers:
        loop.batch.flush()
    assert answers.count == 2
    assert Run.objects.filter(state=RunState.SUCCEEDED).count() == 5


def test_only_a_job_without_callbacks_or_datasets_ends_plainly():
    """What the worker makes of a reply: a plain ending (Ending.plain) only for a job whose spec, as
    its claim read it, declares neither callbacks nor datasets."""
    from orchestrator.states import AttemptOutcome
    from orchestrator.worker import Worker

    loop = Worker(["default"], concurrency=1)
    reply = (1, 1, AttemptOutcome.SUCCEEDED, "null", "", "", "", None, "")
    specs = [{"call": "job"}, {"call": "job", "callbacks": {"on_success": "x:y"}}, {"call": "job", "produces": ["d"]},
             {"call": "function"}]
    for spec in specs:
        loop.child_replied({"id": 1, "number": 1, "run_id": 1, "spec": spec}, reply)
    assert [ending.plain for ending in loop.batch.endings] == [True, False, False, False]


@pytest.mark.django_db(transaction=True)
def test_a_batch_that_fails_commits_nothing_and_leaves_the_connection_as_it_found_it(clock):
    """An error in either kind of batch (in the claim sent with its COMMIT, or in an outcome's
    statement) rolls the whole transaction back, and the connection is idle and in autocommit
    for the next batch; the outcomes are kept to be recorded by it."""
    from psycopg.errors import DataError

    from orchestrator.resolver import Ending
    from orchestrator.states import AttemptOutcome
    from orchestrator.worker import Worker

    enqueue_many([{"ref": REF, "kwargs": {"user_id": n}} for n in range(3)], now=clock.now())
    loop = Worker(["default"], concurrency=3)
    loop.register()
    with pytest.raises(DataError, match="LIMIT"):
        loop.batch.flush(claim=-1)  # a negative LIMIT: the claim fails on the server
    assert connection.get_autocommit() and connection.connection.info.transaction_status == 0
    claimed = loop.batch.flush(claim=1)
    assert len(claimed) == 1
    message = claimed[0]
    loop.batch.add(Ending(message["id"], message["number"], AttemptOutcome.SUCCEEDED, result="{not json",
                          job=True, run_id=message["run_id"]))
    with pytest.raises(DataError, match="json"):
        loop.batch.flush(claim=2)  # the outcome's result fails its cast: the claim beside it is undone
    assert connection.get_autocommit() and connection.connection.info.transaction_status == 0
    assert other_connection_count("SELECT count(*) FROM orchestrator_taskrun WHERE state = 'running'") == 1
    assert [e.task_run_id for e in loop.batch.endings] == [message["id"]]


def other_connection_count(sql: str) -> int:
    """A count read on a connection of its own: what the batch committed, not what it holds."""
    from django.db import connections

    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute(sql)
            return cursor.fetchone()[0]
    finally:
        other.close()
