"""A worker's and a dispatcher's statements keep one plan while their connection lives
(``loop.SHORT_TRANSACTION``), until the next ANALYZE of their tables; the plans are made at the
first batches, on a new install or after a purge while the tables are small. Once the tables
doubled, a role analyzes them (``orchestrator.analyze``), so that a batch reads what it works on,
not every row of tables that grew under plans made for a few. Proven by counting the rows a batch
reads (this transaction's own counters, ``pg_stat_xact_all_tables``), with the plans made on
small analyzed tables and the batch measured after thousands of rows more, in one transaction
that autovacuum cannot analyze under it."""

import pytest
from django.db import connection

from orchestrator import analyze, executor, resolver
from orchestrator.jobs import enqueue_many
from orchestrator.models import Run, TaskRun
from orchestrator.resolver import Ending
from orchestrator.runs import trigger_workflow
from orchestrator.states import AttemptOutcome, RunState, TaskState
from tests.support.features_support import sync_module, worker_loop
from tests.test_mapping_scale import MODULE

pytestmark = pytest.mark.django_db

REF = "workflows.jobs:send_welcome_email"
GROWN = 3000  # rows added to each of the run, task run and attempt tables after the plans were made
TABLES = ("orchestrator_run", "orchestrator_taskrun", "orchestrator_attempt")

# Rows read so far in this transaction from each product table (rows of sequential scans and rows
# fetched through indexes, TOAST included).
ROWS_READ = """
SELECT relname, seq_tup_read + COALESCE(idx_tup_fetch, 0) FROM pg_stat_xact_all_tables
WHERE schemaname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
"""


def rows_read() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(ROWS_READ)
        return dict(cursor.fetchall())


def read_by(action) -> dict[str, int]:
    """Rows ``action`` read from each table (those it read any of)."""
    before = rows_read()
    action()
    after = rows_read()
    return {table: after[table] - before.get(table, 0) for table in after if after[table] > before.get(table, 0)}


def fresh_tables() -> None:
    """The tables as a new install has them: no rows, and no pages that rows of other tests, rolled
    back, left behind (statistics taken over those pages count few rows per page, and the planner
    then counts few rows however many are added into that space until the next ANALYZE: a
    different matter, which an ANALYZE ends, kept plans or not)."""
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE orchestrator_run, orchestrator_taskrun, orchestrator_attempt, "
                       "orchestrator_taskruncount CASCADE")


def analyze_tables() -> None:
    """What autovacuum does to a table that grew: new statistics (and every plan of it made anew)."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE orchestrator_run, orchestrator_taskrun, orchestrator_attempt, orchestrator_taskruncount")


def grow(clock) -> None:
    """GROWN finished jobs more: their runs, task runs and attempts, without an ANALYZE."""
    enqueue_many([{"ref": REF, "kwargs": {"user_id": i}} for i in range(GROWN)], now=clock.now())
    with connection.cursor() as cursor:
        cursor.execute(f"""
            WITH t AS (UPDATE orchestrator_taskrun SET state = '{TaskState.SUCCEEDED}', attempts = 1, finished_at = %(now)s
                       WHERE state = '{TaskState.SCHEDULED}' AND spec->>'call' = 'job' RETURNING id)
            INSERT INTO orchestrator_attempt (task_run_id, number, outcome, started_at, finished_at, error, traceback,
                                              log_path)
            SELECT id, 1, '{AttemptOutcome.SUCCEEDED}', %(now)s, %(now)s, '', '', '' FROM t""", {"now": clock.now()})
        cursor.execute(f"UPDATE orchestrator_run SET state = '{RunState.SUCCEEDED}', finished_at = %(now)s "
                       f"WHERE trigger = 'job' AND state = '{RunState.RUNNING}'", {"now": clock.now()})


def work_off(loop, rounds: int = 100) -> int:
    """A worker's batches in this process until nothing is left: each records the outcomes of the
    task runs the one before claimed (run here, as a child would) and claims up to 10 more, in
    one transaction with the worker's settings (its prepared statements, its kept plans); the
    number of batches."""
    claimed: list[dict] = []
    for batches in range(1, rounds + 1):
        for message in claimed:
            loop.batch.add(Ending(*executor.run(message), job=message["spec"].get("call") == "job",
                                  run_id=message["run_id"], unlocked=resolver.settles_later(message)))
        had = bool(claimed)
        claimed = loop.batch.flush(claim=10)
        if not claimed and not had:
            return batches
    raise AssertionError(f"work left after {rounds} batches")


# The look itself, which tests/conftest.py turns off for every other test.
CHECK = analyze.Freshness.check


@pytest.fixture(autouse=True)
def every_batch_looks(monkeypatch):
    """A role looks at the tables' growth at most once a second: here at every batch."""
    monkeypatch.setattr(analyze.Freshness, "check", CHECK)
    monkeypatch.setattr(analyze, "CHECK_SECONDS", 0.0)


def test_a_batch_s_ending_reads_its_own_rows_once_the_tables_grew_under_plans_made_small(clock):
    # Before, the ending statement's kept plan joined its endings to the task runs, their attempts
    # and their runs by hash joins over whole indexes of the tables, and read every row of each at
    # every batch as they grew: 20 endings read 3,043 task runs, 3,043 runs and 3,023 attempts.
    fresh_tables()
    loop = worker_loop()
    loop.batch.poll = 3600  # the concurrency limits read once, before: not the rows counted here
    loop.batch.current_limits()
    enqueue_many([{"ref": REF, "kwargs": {"user_id": i}} for i in range(3)], now=clock.now())
    analyze_tables()
    assert work_off(loop) >= 2  # the first batches: the plans are made, and kept
    grow(clock)
    enqueue_many([{"ref": REF, "kwargs": {"user_id": i}} for i in range(20)], now=clock.now())
    claimed = loop.batch.flush(claim=20)
    assert len(claimed) == 20
    for message in claimed:
        loop.batch.add(Ending(message["id"], message["number"], AttemptOutcome.SUCCEEDED, result="null", job=True,
                              run_id=message["run_id"]))
    read = read_by(loop.batch.flush)
    assert TaskRun.objects.filter(state=TaskState.SUCCEEDED).count() == 3 + GROWN + 20
    # The 20 task runs, their attempts and runs, and for each run the probe for another unfinished
    # task run: a few rows per ending, none of the 3,000 others.
    assert all(read.get(table, 0) <= 3 * 20 for table in TABLES), read


@pytest.fixture
def big(tmp_path):
    return sync_module(tmp_path, MODULE)["big"]


def test_a_workflow_s_batches_read_the_same_rows_once_the_tables_grew_under_plans_made_small(big, clock):
    # A run that lists, maps over the list and totals the results: every statement of a worker's
    # batches (claims, the claimed tasks' context, endings, children released, instances settled,
    # the run finished) is planned on small tables by the first run; the same run is then worked
    # off on small tables and again after each table gained 3,000 rows, and reads the same.
    # Before, the grown tables' run read 81,477,724 task runs (the claimed tasks' context joined
    # every run to every task run) and 21,034 runs.
    fresh_tables()
    loop = worker_loop()
    loop.batch.poll = 3600
    loop.batch.current_limits()
    trigger_workflow(big, {"n": 3}, now=clock.now())
    analyze_tables()
    work_off(loop)

    def a_run() -> None:
        run, _ = trigger_workflow(big, {"n": 5}, now=clock.now())
        work_off(loop)
        run.refresh_from_db()
        assert run.state == RunState.SUCCEEDED
        assert TaskRun.objects.get(run=run, task="total").result == 5

    small = read_by(a_run)
    grow(clock)
    assert Run.objects.count() > GROWN
    # Its first batch analyzes the grown tables (a sample of each, not counted by these counters:
    # a cost per doubling of the tables, not per batch).
    grown = read_by(a_run)
    # Rows of the tables that grew: what the run's own rows and its counts need, then and now (a
    # few more for the entries the first runs' updates left behind), never the 3,000 rows added.
    assert all(grown.get(table, 0) <= small.get(table, 0) + 50 for table in TABLES), \
        {table: (small.get(table, 0), grown.get(table, 0)) for table in TABLES}


def relpages() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname, relpages FROM pg_class WHERE relname = ANY (%s)", [list(TABLES)])
        return dict(cursor.fetchall())


def test_a_role_analyzes_the_job_tables_once_they_doubled_and_looks_at_most_once_a_second(clock, monkeypatch):
    fresh_tables()
    enqueue_many([{"ref": REF, "kwargs": {"user_id": i}} for i in range(200)], now=clock.now())
    analyze_tables()
    freshness = analyze.Freshness()
    assert freshness.check(0.0) == []  # as big as their statistics say: nothing to do
    counted = relpages()
    grow(clock)  # 3,000 jobs more: each table well over twice its pages
    monkeypatch.setattr(analyze, "CHECK_SECONDS", 1.0)
    assert freshness.check(0.5) == []  # too soon after the last look: no look at all
    assert freshness.check(1.0) == sorted(TABLES)
    now_counted = relpages()
    assert all(now_counted[table] >= 2 * counted[table] for table in TABLES), (counted, now_counted)
    assert freshness.check(2.0) == []  # fresh statistics: nothing more


def test_a_role_that_does_not_own_the_tables_is_refused_once_per_doubling_not_every_second(clock, monkeypatch):
    fresh_tables()
    grow(clock)  # never analyzed, and well over the pages counted from
    with connection.cursor() as cursor:
        cursor.execute("CREATE ROLE orchestrator_not_owner")
        cursor.execute("SET LOCAL ROLE orchestrator_not_owner")
    monkeypatch.setattr(analyze, "CHECK_SECONDS", 0.0)
    freshness = analyze.Freshness()
    # PostgreSQL refuses with a warning: nothing renewed, and not asked again at the same size.
    assert freshness.check(0.0) == []
    assert set(freshness.tried) == set(TABLES)
    sent = []
    execute = analyze.db.execute
    monkeypatch.setattr(analyze.db, "execute", lambda cursor, statement, params=None: (
        sent.append(statement), execute(cursor, statement, params))[1])
    assert freshness.check(1.0) == []
    assert sent == [analyze.GROWN]  # the look, and no lock or ANALYZE after it
    with connection.cursor() as cursor:
        cursor.execute("RESET ROLE")
    assert relpages() == {table: 0 for table in TABLES}
