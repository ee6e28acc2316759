"""What a job costs the database when it is created: statements, round trips, rows, wake-ups.
Counted, never timed: one statement (one round trip outside a transaction) for a job's
``create_run``, one statement for N jobs in ``enqueue_many``, idempotency keys decided by the
database within a batch and against stored jobs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from orchestrator.jobs import JobError, enqueue, enqueue_many
from orchestrator.models import Run, TaskRun
from orchestrator.runs import IdempotencyConflict
from orchestrator.states import RunState, TaskState
from tests.support.sent import Sent

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
REF = "workflows.jobs:send_welcome_email"


@pytest.mark.django_db(transaction=True)
def test_a_job_is_created_by_one_statement_in_one_round_trip():
    with Sent() as statements:
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
    with Sent() as statements:
        again, created = enqueue(REF, kwargs={"user_id": 1}, idempotency_key="k", now=NOW)
    assert (created, again.pk) == (False, first.pk)
    assert len(statements.sent) == 2  # the insert the database declined, and the read of the job it kept
    assert (Run.objects.count(), TaskRun.objects.count()) == (1, 1)


def test_the_rows_a_job_writes_at_its_creation_are_its_run_and_its_task_run():
    with Sent() as queries:
        enqueue(REF, args=[1], now=NOW)
    inserts = [sql for sql in queries.sql if "INSERT" in sql]
    assert len(inserts) == 1
    assert (Run.objects.count(), TaskRun.objects.count()) == (1, 1)


def test_a_bad_job_is_refused_before_any_statement():
    with Sent() as queries, pytest.raises(JobError):
        enqueue(REF, run_after=NOW.replace(tzinfo=None) + timedelta(minutes=1), now=NOW)
    assert queries.sql == []


# --- enqueue_many ---------------------------------------------------------------------------------


def test_n_jobs_are_created_by_one_statement():
    items = [{"ref": REF, "kwargs": {"user_id": n}, "queue": "batch" if n % 2 else "default", "priority": n % 3}
             for n in range(300)]
    with Sent() as queries:
        results = enqueue_many(items, now=NOW)
    assert len(queries.sql) == 1
    assert [created for _, created in results] == [True] * 300
    assert len({run.pk for run, _ in results}) == 300
    # Each run has its own task run, with its own call, queue and priority.
    task_runs = {t.run_id: t for t in TaskRun.objects.all()}
    for n, (run, _) in enumerate(results):
        task_run = task_runs[run.pk]
        assert (task_run.spec["kwargs"], task_run.queue, task_run.priority, task_run.state, task_run.due_at) == (
            {"user_id": n}, "batch" if n % 2 else "default", n % 3, TaskState.SCHEDULED, NOW)
        assert (run.trigger, run.priority, run.logical_date) == ("job", n % 3, NOW)


def test_n_jobs_build_n_model_instances_their_runs_and_no_task_run():
    from collections import Counter

    from django.db.models.signals import post_init

    built: Counter = Counter()

    def counted(sender, **kwargs):
        built[sender.__name__] += 1

    post_init.connect(counted, weak=False)
    try:
        results = enqueue_many([{"ref": REF, "kwargs": {"user_id": n}, "priority": n % 3} for n in range(300)]
                               + [{"ref": REF}] * 100, now=NOW)
    finally:
        post_init.disconnect(counted)
    # The task runs' values go to the statement as they are: a model instance per row cost as much
    # as the rest of a job's enqueuing. The runs are the caller's answer, so they are built.
    assert built == {"Run": 400}
    assert TaskRun.objects.count() == 400
    run, _ = results[7]
    task_run = TaskRun.objects.get(run=run)
    assert (task_run.spec["kwargs"], task_run.priority, task_run.state, task_run.max_attempts, task_run.due_at) == (
        {"user_id": 7}, 1, TaskState.SCHEDULED, 1, NOW)
    assert task_run.created_at is not None and task_run.downstream == [] and task_run.attempts == 0
    assert TaskRun.objects.get(run=results[350][0]).spec["args"] == []


def test_a_batch_s_runs_hold_what_the_model_s_constructor_gives_them():
    from orchestrator.jobs import _run_instance

    # enqueue_many builds its runs without Model.__init__ (_run_instance): the same values, the
    # model's defaults for the rest, a new instance's state, a default made anew for each.
    values = {"logical_date": NOW, "trigger": "job", "tenant": "t", "priority": 2, "state": RunState.RUNNING,
              "idempotency_key": "k", "payload_hash": "h"}
    fast, plain = _run_instance(**values), Run(**values)
    fields = [f.attname for f in Run._meta.concrete_fields]
    assert [getattr(fast, name) for name in fields] == [getattr(plain, name) for name in fields]
    assert (fast._state.adding, fast._state.db, fast.pk) == (True, None, None)
    other = _run_instance(**values)
    assert fast.params == {} and fast.params is not other.params
    fast.save()
    assert Run.objects.get(pk=fast.pk).idempotency_key == "k"


def test_a_key_repeated_in_a_batch_with_the_same_request_is_one_job():
    results = enqueue_many([{"ref": REF, "kwargs": {"user_id": 1}, "idempotency_key": "a"},
                            {"ref": REF, "kwargs": {"user_id": 2}},
                            {"ref": REF, "kwargs": {"user_id": 1}, "idempotency_key": "a"}], now=NOW)
    assert [created for _, created in results] == [True, True, False]
    assert results[0][0].pk == results[2][0].pk != results[1][0].pk
    assert (Run.objects.count(), TaskRun.objects.count()) == (2, 2)


def test_a_key_repeated_in_a_batch_with_another_request_refuses_the_batch_before_writing():
    items = [{"ref": REF, "kwargs": {"user_id": 1}, "idempotency_key": "a"},
             {"ref": REF, "kwargs": {"user_id": 2}, "idempotency_key": "a"}]
    with Sent() as queries, pytest.raises(JobError) as caught:
        enqueue_many(items, now=NOW)
    assert caught.value.field == "jobs[1].idempotency_key"
    assert "also the key of jobs[0]" in str(caught.value)
    assert queries.sql == []
    assert Run.objects.count() == 0


def test_a_key_of_a_stored_job_answers_that_job_or_refuses_the_whole_batch():
    stored, _ = enqueue(REF, kwargs={"user_id": 1}, idempotency_key="a", now=NOW)
    results = enqueue_many([{"ref": REF, "kwargs": {"user_id": 1}, "idempotency_key": "a"},
                            {"ref": REF, "kwargs": {"user_id": 2}, "idempotency_key": "b"}], now=NOW)
    assert [(run.pk == stored.pk, created) for run, created in results] == [(True, False), (False, True)]
    assert Run.objects.count() == 2
    # Another request under a stored key: refused, and nothing of the batch is kept.
    with pytest.raises(IdempotencyConflict) as caught:
        enqueue_many([{"ref": REF, "kwargs": {"user_id": 3}, "idempotency_key": "c"},
                      {"ref": REF, "kwargs": {"user_id": 9}, "idempotency_key": "a"}], now=NOW)
    assert caught.value.field == "jobs[1].idempotency_key"
    assert caught.value.existing.pk == stored.pk
    assert not Run.objects.filter(idempotency_key="c").exists()
    assert (Run.objects.count(), TaskRun.objects.count()) == (2, 2)


@pytest.mark.parametrize(("items", "field", "message"), [
    ([{"ref": REF}, {"ref": REF, "queue": "no spaces"}], "jobs[1].queue", "queue must be"),
    ([{"ref": "workflows.jobs:missing"}], "jobs[0].ref", "unknown job"),
    ([{"ref": REF, "when": 1}], "jobs[0]", "unknown argument(s) when"),
    ([{"args": [1]}], "jobs[0].ref", "needs a ref"),
    (["x"], "jobs[0]", "must be a dict"),
    ({"ref": REF}, "jobs", "must be a list"),
])
def test_a_bad_item_is_refused_with_its_place_named_and_nothing_written(items, field, message):
    with Sent() as queries, pytest.raises(JobError) as caught:
        enqueue_many(items, now=NOW)
    assert caught.value.field == field
    assert message in str(caught.value)
    # (A reference may be looked up among the workflows' tasks: a read.)
    assert not [sql for sql in queries.sql if "INSERT" in sql]
    assert Run.objects.count() == 0


# --- claiming: what each claimed job costs --------------------------------------------------------


def worker_table_reads() -> int:
    """Index scans of the worker table in this transaction, counted by PostgreSQL (a foreign key
    check is one, and locks the worker's row)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT COALESCE(idx_scan, 0) + COALESCE(seq_scan, 0) FROM pg_stat_xact_user_tables "
                       "WHERE relname = 'orchestrator_worker'")
        return cursor.fetchone()[0]


def test_claiming_jobs_neither_reads_nor_locks_the_workers_row(clock):
    from django.db import transaction

    from orchestrator.models import Attempt
    from orchestrator.worker import Worker

    enqueue_many([{"ref": REF, "kwargs": {"user_id": n}} for n in range(40)], now=clock.now())
    loop = Worker(["default"], concurrency=4)
    loop.register()
    with transaction.atomic():
        before = worker_table_reads()
        claimed = loop.claim(40, clock.now())
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the foreign key checks a commit would make
        after = worker_table_reads()
    assert len(claimed) == 40
    # The task run and the attempt name their worker (a record, not a reference the database
    # checks): no look-up and no share lock of the worker's row per claimed job.
    assert after - before == 0
    assert Attempt.objects.filter(worker_id=loop.id).count() == 40
    assert TaskRun.objects.filter(worker_id=loop.id, state=TaskState.RUNNING).count() == 40


def test_a_claim_answers_in_dispatch_order_and_what_waits_for_a_child_starts_in_that_order(clock):
    from tests.test_executors import ready_worker

    priorities = [-2, 20, 2, 5, 0, 20]
    enqueued = enqueue_many([{"ref": REF, "kwargs": {"user_id": n}, "priority": p} for n, p in enumerate(priorities)],
                            now=clock.now())
    ids = [run.pk for run, _ in enqueued]
    # Highest priority first, the older first among equals: not the order of the rows' ids.
    expected = [ids[n] for n in sorted(range(len(ids)), key=lambda n: (-priorities[n], n))]
    worker = ready_worker(children=1, places=0)
    worker.register()
    claimed = worker.claim(len(priorities), clock.now())  # all of them: one for the child, five held
    assert [TaskRun.objects.get(pk=m["id"]).run_id for m in claimed] == expected
    worker.place(claimed)
    [slot] = worker.pool.slots
    started = [slot.message["run_id"]]
    while worker.held:
        worker.pool.children.conns[slot.pid].inbox.append((slot.message["id"], 1, "succeeded", None, "", "", "", None, ""))
        worker.loop.wake(slot.conn)
        worker.start_held()
        started.append(slot.message["run_id"])
    assert started == expected


def test_a_job_claimed_ahead_that_waits_too_long_for_a_child_is_handed_back_to_any_worker(clock):
    from orchestrator.clock import pinned
    from orchestrator.models import Attempt
    from orchestrator.worker.local_queue import HELD_SECONDS
    from tests.test_executors import ready_worker

    enqueue_many([{"ref": REF, "kwargs": {"user_id": n}} for n in range(2)], now=clock.now())
    worker = ready_worker(children=1, places=0)
    worker.register()
    # A backlog of short tasks: a claim takes the second job too, held for the child.
    worker.backlog, worker.pool.task_seconds = True, 0.001
    worker.place(worker.claim(worker.capacity(), clock.now()))
    [held] = worker.held.jobs
    allowance = TaskRun.objects.get(pk=held["id"]).max_attempts
    began = worker.held.since[held["id"]]  # its wait for the child
    worker.hand_back_held(began + HELD_SECONDS / 2)
    assert worker.held.jobs == [held] and worker.next_wait() <= HELD_SECONDS / 2 + 0.01
    # A child replied meanwhile (the worker's tasks move, slower than their average said): the
    # queue still moves, and the job waits a second more since then.
    worker.pool.last_reply = began + HELD_SECONDS / 2
    worker.hand_back_held(began + HELD_SECONDS)
    assert worker.held.jobs == [held]
    # The children stayed busy a second with no reply (stuck): the job goes back, for any worker.
    with pinned(clock):
        worker.hand_back_held(began + HELD_SECONDS * 1.5)
    assert worker.held.jobs == [] and worker.held.since == {}
    task_run = TaskRun.objects.get(pk=held["id"])
    # Due again now; the attempt it never started does not count against its allowance.
    assert (task_run.state, task_run.due_at, task_run.attempts, task_run.max_attempts) == (
        TaskState.SCHEDULED, clock.now(), 1, allowance + 1)
    attempt = Attempt.objects.get(task_run_id=held["id"], number=held["number"])
    assert attempt.outcome == "lost" and "claimed ahead" in attempt.error and "without counting" in attempt.error
    # The average is forgotten: nothing more is claimed ahead until a task is seen to be short.
    assert worker.pool.task_seconds is None and worker.prefetch() == 0 and worker.capacity() == 0


def test_a_job_claimed_after_a_sync_whose_notification_has_not_come_starts_in_a_fresh_child(clock):
    from orchestrator import reload
    from orchestrator.clock import pinned
    from orchestrator.executor import READY
    from tests.test_executors import ready_worker

    worker = ready_worker(children=1, places=0)
    worker.register()
    worker.loop.listener = None
    [old] = worker.pool.slots
    # A sync commits (its NOTIFY still on its way), then a job is enqueued and claimed.
    generation = reload.bump()
    assert generation != worker.pool.generation
    enqueue_many([{"ref": REF, "kwargs": {"user_id": 1}}], now=clock.now())
    with pinned(clock):
        assert worker.record_and_claim(0.0)
    # The claim read the new generation: the old child is told to exit, the job waits for a fresh one.
    assert worker.pool.generation == generation and old not in worker.pool.slots
    assert [m["spec"]["kwargs"] for m in worker.held.jobs] == [{"user_id": 1}] and worker.held.since == {}
    [fresh] = worker.pool.slots
    worker.pool.children.conns[fresh.pid].inbox.append(READY)
    worker.loop.wake(fresh.conn)
    worker.start_held()
    assert fresh.message["spec"]["kwargs"] == {"user_id": 1} and worker.held.jobs == []


def test_a_run_over_at_birth_is_one_row_and_a_pending_one_holds_its_tasks_back():
    from orchestrator.runs import create_run
    from orchestrator.states import RunState

    with Sent() as queries:
        skipped, created = create_run(None, trigger="job", tasks={"a": {"kind": "python", "ref": REF}},
                                      state=RunState.SKIPPED, reason="overlap", now=NOW)
    assert created is True and len(queries.sql) == 1
    assert (Run.objects.get(pk=skipped.pk).state, Run.objects.get(pk=skipped.pk).finished_at) == (RunState.SKIPPED, NOW)
    assert not TaskRun.objects.filter(run=skipped).exists()
    held, _ = create_run(None, trigger="job", tasks={"a": {"kind": "python", "ref": REF},
                                                     "b": {"kind": "python", "ref": REF, "upstream": ["a"]}},
                         state=RunState.PENDING, now=NOW)
    assert dict(TaskRun.objects.filter(run=held).values_list("task", "state")) == {
        "a": TaskState.WAITING, "b": TaskState.WAITING}
    assert TaskRun.objects.get(run=held, task="b").upstream == ["a"]


# --- a job's writes: which of them PostgreSQL makes HOT updates ------------------------------------


def job_table_writes() -> dict[str, tuple[int, int, int]]:
    """(inserts, updates, HOT updates) per job table, counted by PostgreSQL: this transaction's and
    the earlier ones this connection has not reported yet (compare two readings)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables "
                       "WHERE relname IN ('orchestrator_run', 'orchestrator_taskrun', 'orchestrator_attempt')")
        return {name.removeprefix("orchestrator_"): (ins, upd, hot) for name, ins, upd, hot in cursor.fetchall()}


def since(before: dict) -> dict[str, tuple[int, int, int]]:
    after = job_table_writes()
    return {name: tuple(a - b for a, b in zip(after[name], before.get(name, (0, 0, 0)), strict=True))
            for name in after}


@pytest.mark.django_db(transaction=True)
def test_a_job_s_start_and_its_attempt_s_end_are_hot_updates_that_write_no_index(clock):
    from django.db import transaction

    from orchestrator.models import Attempt
    from orchestrator.resolver import Ending, end_attempts
    from orchestrator.states import AttemptOutcome, RunState
    from orchestrator.worker import Worker

    enqueue_many([{"ref": REF, "kwargs": {"user_id": n}} for n in range(10)], now=clock.now())
    loop = Worker(["default"], concurrency=10)
    loop.register()
    with transaction.atomic():
        before = job_table_writes()
        claimed = loop.claim(10, clock.now())
        claim = since(before)
    assert len(claimed) == 10
    # Before PostgreSQL 16 a BRIN index on a changed column (the metrics' indexes) rules out a HOT
    # update too; from 16 on it does not.
    hot = 10 if connection.pg_version >= 160000 else 0
    # The claim: each task run becomes running (its state is indexed: a plain update), its attempt
    # is inserted, and its run's start is recorded in place (no B-tree names started_at).
    assert claim == {"taskrun": (0, 10, 0), "attempt": (10, 0, 0), "run": (0, 10, hot)}
    clock.advance(1)
    with transaction.atomic():
        before = job_table_writes()
        accepted = end_attempts([Ending(m["id"], m["number"], AttemptOutcome.SUCCEEDED, result="null", job=True,
                                        run_id=m["run_id"]) for m in claimed], worker_id=loop.id, now=clock.now())
        end = since(before)
    assert len(accepted) == 10
    # The end: the attempt's outcome and end time are in no B-tree, so it is updated in place; the
    # task run and the run change state (indexed).
    assert end["attempt"] == (0, 10, hot)
    assert end["taskrun"][:2] == (0, 10) and end["run"][:2] == (0, 10)
    assert set(Attempt.objects.values_list("outcome", flat=True)) == {AttemptOutcome.SUCCEEDED}
    assert set(Run.objects.values_list("state", flat=True)) == {RunState.SUCCEEDED}
    assert Run.objects.filter(started_at=clock.now() - timedelta(seconds=1), schedule_delay__isnull=False).count() == 10


def test_the_reaper_finds_a_dead_worker_s_attempts_through_its_running_task_runs(clock):
    from orchestrator.models import Attempt
    from orchestrator.models import Worker as WorkerRow
    from orchestrator.reaper import reap_once
    from orchestrator.states import AttemptOutcome, WorkerState
    from orchestrator.worker import Worker

    enqueue_many([{"ref": REF, "kwargs": {"user_id": n}} for n in range(3)], now=clock.now())
    gone, alive = Worker(["default"], concurrency=2), Worker(["default"], concurrency=1)
    gone.register()
    alive.register()
    mine = gone.claim(2, clock.now())
    theirs = alive.claim(1, clock.now())
    WorkerRow.objects.filter(pk=gone.id).update(state=WorkerState.STOPPED)
    # Only the stopped worker's attempts are ended (lost), through the retry rule (one attempt: dead).
    assert reap_once(clock) == 2
    lost = set(Attempt.objects.filter(outcome=AttemptOutcome.LOST).values_list("task_run_id", flat=True))
    assert lost == {m["id"] for m in mine}
    assert Attempt.objects.get(task_run_id=theirs[0]["id"]).outcome == AttemptOutcome.RUNNING
    assert set(TaskRun.objects.filter(id__in=lost).values_list("state", flat=True)) == {TaskState.DEAD}


def test_a_batch_s_endings_go_in_statements_of_about_fifty_cut_between_runs_in_run_order():
    from orchestrator.resolver import Ending
    from orchestrator.states import AttemptOutcome
    from orchestrator.worker.batch import ENDINGS_PER_STATEMENT, chunks

    # 120 job endings (a run each) and a run of 30 task endings in the middle, out of order.
    endings = [Ending(n, 1, AttemptOutcome.SUCCEEDED, run_id=n) for n in range(120, 0, -1)]
    endings[10:10] = [Ending(1000 + n, 1, AttemptOutcome.SUCCEEDED, run_id=45) for n in range(30)]
    parts = chunks(endings)
    assert sorted(e.task_run_id for part in parts for e in part) == sorted(e.task_run_id for e in endings)
    runs = [e.run_id for part in parts for e in part]
    assert runs == sorted(runs)  # run locks taken in one order across the statements
    # No run is split between two statements, and none is much larger than the bound.
    assert all(not ({e.run_id for e in a} & {e.run_id for e in b}) for a, b in zip(parts, parts[1:], strict=False))
    # Runs 1-44 and run 45's 31 endings; then 50 runs; the rest.
    assert [len(part) for part in parts] == [44 + 31, ENDINGS_PER_STATEMENT, 150 - 75 - ENDINGS_PER_STATEMENT]
    assert chunks([]) == []


# --- ending many jobs in one statement --------------------------------------------------------------


def rows_through(plan: dict) -> float:
    """Rows every node of a plan produced, over all its loops: what the statement handled."""
    return plan["Actual Rows"] * plan["Actual Loops"] + sum(rows_through(child) for child in plan.get("Plans", []))


def ending_rows(clock, n: int, generic: bool) -> float:
    """Rows END_TASK_RUNS handles to end ``n`` claimed jobs in one statement (EXPLAIN ANALYZE, its
    writes rolled back with the transaction), planned as a generic plan (what a prepared statement
    turns to) or with its parameters' values; the tables analyzed, as a working database is."""
    import json

    from django.db import transaction

    from orchestrator import db, resolver
    from orchestrator.resolver import Ending
    from orchestrator.states import AttemptOutcome
    from orchestrator.worker import Worker

    enqueue_many([{"ref": REF, "kwargs": {"user_id": i}} for i in range(n)], now=clock.now())
    loop = Worker(["default"], concurrency=4)
    loop.register()
    with transaction.atomic():
        claimed = loop.claim(n, clock.now())
    assert len(claimed) == n
    endings = [Ending(m["id"], m["number"], AttemptOutcome.SUCCEEDED, result="null", job=True, run_id=m["run_id"])
               for m in claimed]
    params = {"runs": sorted(e.run_id for e in endings), "worker": loop.id, "now": clock.now(),
              "jobs": [True] * n, "job_runs": sorted(e.run_id for e in endings), **resolver._columns(endings)}
    text, names = db.native(resolver.END_TASK_RUNS)
    with transaction.atomic(), db.cursor() as cursor:
        cursor.execute("ANALYZE orchestrator_run, orchestrator_taskrun, orchestrator_attempt")
        cursor.execute(f"SET LOCAL plan_cache_mode = {'force_generic_plan' if generic else 'force_custom_plan'}")
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + text, [params[name] for name in names])
        plan = cursor.fetchone()[0]
        plan = json.loads(plan) if isinstance(plan, str) else plan
        # Every job and its run ended (the statement ran for real inside the transaction).
        assert (TaskRun.objects.filter(state=TaskState.SUCCEEDED).count(),
                Run.objects.filter(state=RunState.SUCCEEDED).count()) == (n, n)
        transaction.set_rollback(True)
    return rows_through(plan[0]["Plan"])


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
def test_ending_ten_times_the_jobs_in_one_statement_handles_about_ten_times_the_rows(clock, generic):
    # Before, the answer joined the ended task runs to the job runs they ended by a nested loop
    # (the planner expects one row of each), reading every ended run again per task run: 4,000
    # rows for 50 endings, 264,000 for 500. Now every CTE is read once: about 10x for 10x.
    small = ending_rows(clock, 50, generic)
    TaskRun.objects.all().delete()
    Run.objects.all().delete()
    large = ending_rows(clock, 500, generic)
    assert large <= 12 * small, (small, large)


@pytest.mark.django_db(transaction=True)
def test_a_database_error_of_the_prepared_insert_is_djangos_and_writes_nothing():
    """The insert of new runs goes through the prepared path, not Django's cursor; its errors still
    reach the caller as Django's (an IntegrityError here: a creator that does not exist)."""
    from django.contrib.auth import get_user_model
    from django.db import IntegrityError

    ghost = get_user_model()(pk=987654, username="ghost")
    with pytest.raises(IntegrityError, match="created_by"):
        enqueue_many([{"ref": REF}], created_by=ghost, now=NOW)
    assert (Run.objects.count(), TaskRun.objects.count()) == (0, 0)
    # The connection is usable afterwards.
    assert enqueue_many([{"ref": REF}], now=NOW)[0][1] is True
