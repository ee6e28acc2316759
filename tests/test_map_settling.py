"""A map's instances are recorded without their run's lock, so two workers' batches of one map
do not take turns: the lock is taken only to settle the map, by a statement of its own, and a run
another transaction holds at that moment is settled once the batch committed (by the worker, or
by the reaper when the worker died in between). On real PostgreSQL, with a second connection
holding the run's row lock as another worker's batch or an operator's action would."""

import json

import psycopg
import pytest
from django.db import connection

from orchestrator import executor, mapping, reaper, resolver
from orchestrator.models import TaskRun
from orchestrator.resolver import Ending
from orchestrator.runs import trigger_workflow
from orchestrator.states import TaskState
from tests.support.features_support import sync_module, worker_loop
from tests.test_execution_rules import execute_claimed

pytestmark = pytest.mark.django_db(transaction=True)

MODULE = '''
from orchestrator.dsl import Param, Workflow

fan = Workflow("fan", params={"n": Param(int, default=4)})

@fan.task
def listing(ctx):
    return list(range(ctx.params["n"]))

@fan.task
def square(ctx):
    return ctx.item * ctx.item

square.map(over=listing)

@fan.task
def total(ctx):
    return sum(ctx.upstream["square"])

square >> total

capped = Workflow("capped")

@capped.task
def few(ctx):
    return [1, 2, 3]

@capped.task
def each(ctx):
    return ctx.item

each.map(over=few, max_parallel=2)
'''


@pytest.fixture
def workflows(tmp_path):
    return sync_module(tmp_path, MODULE)


def mapped(workflows, clock, loop, n):
    """A run of ``fan`` whose listing succeeded: its n instances are due."""
    run, _ = trigger_workflow(workflows["fan"], {"n": n}, now=clock.now())
    assert [m["task"] for m in execute_claimed(loop, 1, clock)] == ["listing"]
    return run


def ran(messages) -> list[Ending]:
    """Run the claimed tasks here and end them as the worker does (its flag from the claim)."""
    return [Ending(*executor.run(m), run_id=m["run_id"], unlocked=resolver.settles_later(m)) for m in messages]


def state(run, task) -> str:
    return TaskRun.objects.get(run=run, task=task, map_index=-1).state


def assert_settled(run, results):
    square = TaskRun.objects.get(run=run, task="square", map_index=-1)
    assert (square.state, square.result) == (TaskState.SUCCEEDED, results)
    assert state(run, "total") == TaskState.SCHEDULED


class Holder:
    """Another connection holding a run's row lock, as another batch or an operator would."""

    def __init__(self, run_id):
        s = connection.settings_dict
        self.conn = psycopg.connect(dbname=s["NAME"], user=s["USER"], password=s["PASSWORD"] or None,
                                    host=s["HOST"] or None, port=s["PORT"] or None)
        self.conn.execute("SELECT id FROM orchestrator_run WHERE id = %s FOR NO KEY UPDATE", [run_id])

    def release(self):
        self.conn.commit()
        self.conn.close()


def flush_while_held(run, *loops):
    """Each worker records its endings while another transaction holds the run."""
    holder = Holder(run.pk)
    try:
        for loop in loops:
            loop.batch.flush()
    finally:
        holder.release()


@pytest.fixture
def no_waiting():
    """A lock wait fails at once instead of hanging the test (as the batch did before)."""
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '3s'")
    yield
    with connection.cursor() as cursor:
        cursor.execute("RESET lock_timeout")


def test_only_a_maps_own_instances_are_recorded_without_the_lock(workflows, clock):
    loop = worker_loop()
    run = mapped(workflows, clock, loop, 2)
    instances = loop.batch.flush(claim=2)
    assert all(resolver.settles_later(m) for m in instances)
    # The mapped-over task itself, a job, and an instance of a map with max_parallel (whose
    # releases count the running instances under the lock) are recorded under it.
    capped, _ = trigger_workflow(workflows["capped"], {}, now=clock.now())
    few = loop.batch.flush(claim=1)
    assert [m["task"] for m in few] == ["few"] and not resolver.settles_later(few[0])
    loop.batch.endings = ran(few)
    loop.batch.flush()  # its instances are created as its success is recorded
    each = loop.batch.flush(claim=2)
    assert [m["task"] for m in each] == ["each", "each"]
    assert not any(resolver.settles_later(m) for m in each)
    assert run.pk != capped.pk


def test_a_batch_settles_its_map_at_once_when_nobody_holds_the_run(workflows, clock):
    loop = worker_loop()
    run = mapped(workflows, clock, loop, 3)
    loop.batch.endings = ran(loop.batch.flush(claim=3))
    loop.batch.flush()
    assert loop.batch.unsettled == set()
    assert_settled(run, [0, 1, 4])


def test_a_batch_of_instances_does_not_wait_for_a_run_another_transaction_holds(workflows, clock, no_waiting):
    loop = worker_loop()
    run = mapped(workflows, clock, loop, 3)
    loop.batch.endings = ran(loop.batch.flush(claim=3))
    # Before, the batch's first statement waited for the run (here: failed after 3 s).
    flush_while_held(run, loop)
    assert TaskRun.objects.filter(run=run, map_index__gte=0, state=TaskState.SUCCEEDED).count() == 3
    # The holder cannot have seen those endings, so the map is settled after the commit.
    assert state(run, "square") == TaskState.MAPPED
    assert loop.batch.unsettled == {run.pk}
    loop.batch.settle()
    assert loop.batch.unsettled == set()
    assert_settled(run, [0, 1, 4])


def test_two_workers_ending_a_maps_last_instances_at_once_settle_it_once(workflows, clock, no_waiting):
    first, second = worker_loop(), worker_loop()
    run = mapped(workflows, clock, first, 4)
    first.batch.endings = ran(first.batch.flush(claim=2))
    second.batch.endings = ran(second.batch.flush(claim=2))
    flush_while_held(run, first, second)
    assert state(run, "square") == TaskState.MAPPED
    first.batch.settle()
    second.batch.settle()
    assert_settled(run, [0, 1, 4, 9])


def test_the_reaper_settles_a_map_whose_worker_died_before_settling_it(workflows, clock, no_waiting):
    loop = worker_loop()
    run = mapped(workflows, clock, loop, 3)
    loop.batch.endings = ran(loop.batch.flush(claim=3))
    flush_while_held(run, loop)
    loop.batch.unsettled.clear()  # the worker died here
    assert state(run, "square") == TaskState.MAPPED
    # A map still in progress is left alone; this one is settled.
    other = mapped(workflows, clock, loop, 2)
    reaper.reap_once(clock)
    assert_settled(run, [0, 1, 4])
    assert state(other, "square") == TaskState.MAPPED
    assert reaper.settle_maps(clock) == 0


def test_the_reapers_look_for_unsettled_maps_reads_no_instance_of_a_map_in_progress(workflows, clock):
    loop = worker_loop()
    mapped(workflows, clock, loop, 2000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE orchestrator_taskrun")
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + reaper.SETTLE_MAPS)
        plan = cursor.fetchone()[0][0]["Plan"]

    def rows(node) -> int:
        return int(node.get("Actual Rows", 0) * node.get("Actual Loops", 1)) + sum(map(rows, node.get("Plans", [])))

    # One mapped task, one probe of its instances that stops at the first active one.
    assert rows(plan) <= 10, plan


def settle_reads(run, now) -> int:
    """Task runs the settling statement reads in this run (EXPLAIN ANALYZE: rows out of each scan
    of orchestrator_taskrun plus its heap fetches, which count the entries of ended instances it
    walks; the counts' fold, bounded by counts.FOLD_AT, is not counted)."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + mapping.SETTLE, {"runs": [run.pk], "now": now})
        plan = cursor.fetchone()[0]
    plan = plan if isinstance(plan, list) else json.loads(plan)

    def reads(node) -> int:
        on_task_runs = node.get("Relation Name") == "orchestrator_taskrun" or node.get("Index Name", "").startswith(
            ("taskrun_", "orchestrator_taskrun_"))
        own = node.get("Actual Rows", 0) * node.get("Actual Loops", 1) + node.get("Heap Fetches", 0)
        return int(own if on_task_runs and "Scan" in node["Node Type"] else 0) + sum(map(reads, node.get("Plans", [])))

    return reads(plan[0]["Plan"])


def test_whether_a_map_is_over_is_asked_without_walking_its_ended_instances(workflows, clock):
    # Ended instances leave entries in the index of active ones until a vacuum (claims keep
    # changing those pages, so scans cannot mark them dead): a probe that met them first would read
    # more at every batch, a cost that grows with the instances ended so far (before: 2 -> 2,001).
    loop = worker_loop()
    run = mapped(workflows, clock, loop, 3000)
    read = []
    for ending in (0, 2000):
        while TaskRun.objects.filter(run=run, map_index__gte=0, state=TaskState.SUCCEEDED).count() < ending:
            loop.batch.endings = ran(loop.batch.flush(claim=200))
            loop.batch.flush()
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE orchestrator_taskrun")  # as autovacuum would: plans for a table of this size
        read.append(settle_reads(run, clock.now()))
    assert state(run, "square") == TaskState.MAPPED
    assert read[1] <= read[0] + 10, read
