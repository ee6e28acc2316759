"""Mapping at scale, proven by counting on real PostgreSQL: what a worker's batch of mapped
instances reads and sends does not grow with the number of items, the instances are created in
one statement that walks the list once, and a run's end is decided by an index probe however many
task runs the run has. Rows read are the current transaction's own counters
(``pg_stat_xact_all_tables``: rows read by sequential scans and fetched through indexes, TOAST
included), so other sessions on the server do not count."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from orchestrator import control, db, executor, resolver
from orchestrator.models import Run, TaskRun
from orchestrator.resolver import Ending
from orchestrator.runs import trigger_workflow
from orchestrator.states import TaskState
from tests.support.features_support import sync_module, worker_loop
from tests.test_execution_rules import execute_claimed, job_spec, make_run

pytestmark = pytest.mark.django_db

MODULE = '''
from orchestrator.dsl import Param, Workflow

big = Workflow("big", params={"n": Param(int, default=3)})

@big.task
def listing(ctx):
    # Items of some size, so the list is stored out of line (TOAST) as a real one would be.
    return ["item %06d" % i for i in range(ctx.params["n"])]

@big.task
def one(ctx):
    return {"item": ctx.item, "upstream": ctx.upstream}

one.map(over=listing)

@big.task
def total(ctx):
    return len(ctx.upstream["one"])

one >> total
'''

BATCH = 10
SMALL, LARGE = 1000, 10_000


def rows_read() -> int:
    """Rows this transaction has read so far, over the product's tables (TOAST tables included;
    not the catalogs, which this query itself reads)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT COALESCE(sum(seq_tup_read + COALESCE(idx_tup_fetch, 0)), 0) FROM pg_stat_xact_all_tables "
                       "WHERE schemaname NOT IN ('pg_catalog', 'information_schema')")
        return int(cursor.fetchone()[0])


class Counted:
    """Statements sent (through Django's cursor and the prepared path) and rows read in a block."""

    def __init__(self, monkeypatch):
        self.prepared = 0
        execute = db.execute

        def counting(cursor, statement, params=None):
            self.prepared += 1
            return execute(cursor, statement, params)

        monkeypatch.setattr(db, "execute", counting)

    def __enter__(self):
        self.prepared, self.start = 0, rows_read()
        self.django = CaptureQueriesContext(connection)
        self.django.__enter__()
        return self

    def __exit__(self, *exc):
        self.django.__exit__(*exc)
        self.rows = rows_read() - self.start
        self.statements = self.prepared + len([q for q in self.django.captured_queries
                                               if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))])


@pytest.fixture
def big(tmp_path):
    return sync_module(tmp_path, MODULE)["big"]


def mapped_run(big, clock, loop, n):
    """A run whose listing succeeded with n items: its n instances exist, all due."""
    run, _ = trigger_workflow(big, {"n": n}, now=clock.now())
    assert [m["task"] for m in execute_claimed(loop, 1, clock)] == ["listing"]
    listing = TaskRun.objects.get(run=run, task="listing")
    assert listing.state == TaskState.SUCCEEDED, listing.error
    assert TaskRun.objects.filter(run=run, task="one", map_index__gte=0, state=TaskState.SCHEDULED).count() == n
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE orchestrator_taskrun")  # as autovacuum would: plans for a table of this size
        cursor.execute("ANALYZE orchestrator_taskruncount")
    return run


def batch_costs(big, clock, monkeypatch, n) -> tuple[Counted, Counted, list[dict]]:
    """What a worker pays for a claim of BATCH instances, and for the next batch: recording their
    outcomes (resolving the run) and claiming BATCH more; in a run mapping over n items."""
    loop = worker_loop()
    run = mapped_run(big, clock, loop, n)
    counted = Counted(monkeypatch)
    # The concurrency limits are read once per poll interval, not per batch: here once, before.
    loop.batch.poll = 3600
    loop.batch.current_limits()
    with counted as claim:
        messages = loop.batch.flush(claim=BATCH)
    assert len(messages) == BATCH
    for message in messages:
        loop.batch.add(Ending(*executor.run(message)))
    with Counted(monkeypatch) as outcomes:
        assert len(loop.batch.flush(claim=BATCH)) == BATCH
    control.cancel_run(run)  # its other instances are not the next scenario's
    return claim, outcomes, messages


def test_a_claim_of_instances_sends_one_statement_more_than_a_claim_of_plain_jobs(big, clock, monkeypatch):
    # The instances' context (run, parents' results, items) is one statement: the claiming
    # transaction holds the run's lock, which every batch of the map waits for (before: two).
    instances, _, _ = batch_costs(big, clock, monkeypatch, SMALL)
    loop = worker_loop()
    for _ in range(BATCH):
        make_run({"a": job_spec("add")}, clock)
    loop.batch.poll = 3600
    loop.batch.current_limits()
    with Counted(monkeypatch) as jobs:
        assert len(loop.batch.flush(claim=BATCH)) == BATCH
    assert instances.statements == jobs.statements + 1, (instances.statements, jobs.statements)


def test_a_batch_of_instances_costs_the_same_whatever_the_number_of_items(big, clock, monkeypatch):
    small_claim, small_outcomes, _ = batch_costs(big, clock, monkeypatch, SMALL)
    large_claim, large_outcomes, messages = batch_costs(big, clock, monkeypatch, LARGE)
    # Each instance was given its own item, and the mapped-over parent's name holds that item in
    # ctx.upstream: not the list of 10,000.
    assert [m["item"] for m in messages] == [f"item {i:06d}" for i in range(BATCH)]
    assert [m["upstream"] for m in messages] == [{"listing": m["item"]} for m in messages]
    # A claim of ten instances and a batch that records ten outcomes (resolving the run: is the
    # mapped task done? is the run done?) and claims ten more: the same statements, and the same
    # rows read, in a map over 1,000 items and over 10,000.
    assert (large_claim.statements, large_outcomes.statements) == (small_claim.statements, small_outcomes.statements)
    # Rows read: flat, to within a quarter (the second scenario runs beside the first one's cancelled
    # rows and what earlier tests left, and a server that has not vacuumed them yet reads a few of
    # their index entries: in a full suite on a loaded two-core machine, 75 -> 87); a cost that grew
    # with the list would read several times more (before: 119 -> 442 and 1,181 -> 10,504).
    assert large_claim.rows <= small_claim.rows * 1.25, (small_claim.rows, large_claim.rows)
    assert large_outcomes.rows <= small_outcomes.rows * 1.25, (small_outcomes.rows, large_outcomes.rows)


def expansion_reads(big, clock, n) -> int:
    loop = worker_loop()
    run, _ = trigger_workflow(big, {"n": n}, now=clock.now())
    messages = loop.claim(1, clock.now())
    endings = [Ending(*executor.run(m)) for m in messages]
    before = rows_read()
    # Recording the list's success creates the instances (mapping.EXPAND), in this transaction.
    resolver.end_attempts(endings, worker_id=loop.id, now=clock.now())
    assert TaskRun.objects.filter(run=run, task="one", map_index__gte=0).count() == n
    read = rows_read() - before
    control.cancel_run(run)  # its instances are not the next scenario's
    return read


def test_the_instances_are_created_reading_the_list_once(big, clock):
    # The rows (and TOAST chunks) read to record the list's success and create its instances grow
    # with the list, not with its square: ten times the items, at most about ten times the reads.
    small, large = expansion_reads(big, clock, 300), expansion_reads(big, clock, 3000)
    assert large <= 12 * small + 100, (small, large)
    # And each instance holds its item.
    assert TaskRun.objects.get(task="one", map_index=2999).item == "item 002999"


def test_a_child_of_the_mapped_task_gets_the_ordered_list_of_results(big, clock):
    loop = worker_loop()
    run = mapped_run(big, clock, loop, 25)
    for _ in range(10):
        if not execute_claimed(loop, 10, clock):
            break
    run.refresh_from_db()
    assert run.state == "succeeded"
    own = TaskRun.objects.get(run=run, task="one", map_index=-1)
    assert [r["item"] for r in own.result] == [f"item {i:06d}" for i in range(25)]
    assert own.result[3]["upstream"] == {"listing": "item 000003"}
    assert TaskRun.objects.get(run=run, task="total").result == 25


FINISH_PLAN = "EXPLAIN (ANALYZE, FORMAT JSON) " + resolver.FINISH_RUNS


def finish_runs_reads(run_id: int, now) -> int:
    """Rows of orchestrator_taskrun that FINISH_RUNS reads for one run (over every loop)."""
    from tests.test_reads import reads_of

    with connection.cursor() as cursor:
        cursor.execute(FINISH_PLAN, {"runs": [run_id], "now": now})
        plan = cursor.fetchone()[0][0]["Plan"]
    return reads_of(plan, "orchestrator_taskrun")[0]


def wide_run(clock, tasks: int) -> Run:
    """A running run of ``tasks`` task runs, all succeeded but the last, still running."""
    run = Run.objects.create(logical_date=clock.now(), trigger="manual", state="running")
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO orchestrator_taskrun (run_id, task, state, spec, upstream, queue, priority, tenant, lane,
                                                 attempts, max_attempts, error, created_at)
               SELECT %(run)s, 't' || i, CASE WHEN i = %(n)s THEN 'running' ELSE 'succeeded' END, '{}', '{}',
                      'default', 0, 'default', 0, 1, 1, '', %(now)s
               FROM generate_series(1, %(n)s) AS i""", {"run": run.pk, "n": tasks, "now": clock.now()})
        cursor.execute("ANALYZE orchestrator_taskrun")
    return run


def test_whether_a_run_is_complete_is_one_index_probe_whatever_its_size(clock):
    small, large = wide_run(clock, 10), wide_run(clock, 10_000)
    # Each has one task run still running: the run goes on, found by reading that one entry.
    assert finish_runs_reads(small.pk, clock.now()) == finish_runs_reads(large.pk, clock.now()) == 1
    small.refresh_from_db()
    assert small.state == "running"
    # The last one ends: the run ends, succeeded.
    TaskRun.objects.filter(run=large, state="running").update(state="succeeded")
    with connection.cursor() as cursor:
        cursor.execute(resolver.FINISH_RUNS, {"runs": [large.pk], "now": clock.now()})
        assert cursor.fetchall() == [(large.pk, "succeeded", None)]
