"""Releasing children and ending a run cost what ended, not the run's size: a batch that ends one
task run of a run with 10,000 waiting tasks reads that task run's children (by the names it
keeps, ``TaskRun.downstream``), and the batch that ends a run of 10,000 task runs tells success
from failure from the run's counts, not by reading its task runs. Rows read are the current
transaction's own counters, as in ``tests/test_mapping_scale.py``."""

import pytest
from django.db import connection

from orchestrator import resolver
from orchestrator.models import Run, TaskRun
from tests.test_mapping_scale import rows_read
from tests.test_reads import reads_of

pytestmark = pytest.mark.django_db

SMALL, LARGE = 10, 10_000


def waiting_run(clock, waiting: int, downstream: bool = True) -> Run:
    """A running run: ``a`` succeeded (its child ``b`` waits for it), ``y`` running, and
    ``waiting`` tasks x1, x2, ... waiting for ``y``. ``downstream``: whether the task runs know
    their children (those made before that was kept do not)."""
    run = Run.objects.create(logical_date=clock.now(), trigger="manual", state="running")
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO orchestrator_taskrun (run_id, task, state, spec, upstream, downstream, queue, priority,
                                                 tenant, lane, attempts, max_attempts, error, created_at)
               SELECT %(run)s, t.task, t.state, '{}'::jsonb, t.upstream,
                      CASE WHEN %(known)s THEN t.downstream END, 'default', 0, 'default', 0, 1, 1, '', %(now)s
               FROM (VALUES ('a', 'succeeded', '{}'::varchar[], '{b}'::varchar[]),
                            ('b', 'waiting', '{a}', '{}'),
                            ('y', 'running', '{}', NULL)) AS t(task, state, upstream, downstream)
               UNION ALL
               SELECT %(run)s, 'x' || i, 'waiting', '{}', '{y}', '{}', 'default', 0, 'default', 0, 1, 1, '', %(now)s
               FROM generate_series(1, %(n)s) AS i""",
            {"run": run.pk, "n": waiting, "now": clock.now(), "known": downstream})
        cursor.execute("ANALYZE orchestrator_taskrun")
    return run


def release_reads(clock, waiting: int, downstream: bool = True) -> int:
    run = waiting_run(clock, waiting, downstream)
    a = TaskRun.objects.get(run=run, task="a")
    before = rows_read()
    released = resolver.resolve_runs([run.pk], now=clock.now(), ended=[a.pk])
    read = rows_read() - before
    # b is released, the others still wait for y, and the run goes on.
    assert released == 1
    assert TaskRun.objects.get(run=run, task="b").state == "scheduled"
    assert TaskRun.objects.filter(run=run, state="waiting").count() == waiting
    run.refresh_from_db()
    assert run.state == "running"
    return read


def test_a_batch_reads_the_children_of_what_ended_not_every_waiting_task_of_the_run(clock):
    small, large = release_reads(clock, SMALL), release_reads(clock, LARGE)
    assert large <= small + 10, (small, large)
    # Task runs that do not know their children (made before they were kept): every waiting task
    # run of the run is looked at, as before, so the answer is the same and the cost grows.
    assert release_reads(clock, LARGE, downstream=False) >= LARGE


def test_a_child_decided_as_not_running_decides_its_own_children_in_turn(clock):
    # a -> b -> c: a failed, so b and then c are upstream_failed, each by the one before.
    run = Run.objects.create(logical_date=clock.now(), trigger="manual", state="running")
    for task, state, upstream, downstream in (("a", "dead", [], ["b"]), ("b", "waiting", ["a"], ["c"]),
                                              ("c", "waiting", ["b"], [])):
        TaskRun.objects.create(run=run, task=task, state=state, upstream=upstream, downstream=downstream)
    a = TaskRun.objects.get(run=run, task="a")
    assert resolver.resolve_runs([run.pk], now=clock.now(), ended=[a.pk]) == 0
    assert dict(TaskRun.objects.filter(run=run).values_list("task", "state")) == {
        "a": "dead", "b": "upstream_failed", "c": "upstream_failed"}
    run.refresh_from_db()
    assert run.state == "failed"


def last_batch_reads(clock, tasks: int) -> tuple[int, list]:
    """Rows of orchestrator_taskrun that FINISH_RUNS reads when the last task run of a run of
    ``tasks`` has ended (all succeeded), and what it answered."""
    run = Run.objects.create(logical_date=clock.now(), trigger="manual", state="running")
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO orchestrator_taskrun (run_id, task, state, spec, upstream, queue, priority, tenant, lane,
                                                 attempts, max_attempts, error, created_at)
               SELECT %(run)s, 't' || i, 'succeeded', '{}', '{}', 'default', 0, 'default', 0, 1, 1, '', %(now)s
               FROM generate_series(1, %(n)s) AS i""", {"run": run.pk, "n": tasks, "now": clock.now()})
        cursor.execute("ANALYZE orchestrator_taskrun")
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + resolver.FINISH_RUNS, {"runs": [run.pk], "now": clock.now()})
        plan = cursor.fetchone()[0][0]["Plan"]
    run.refresh_from_db()
    return reads_of(plan, "orchestrator_taskrun")[0], run.state


def test_the_batch_that_ends_a_run_reads_no_task_run_of_it(clock):
    # Before, the last batch read every task run of the run to find one that did not end well
    # (10,000 here). Now none: only whether one is unfinished, one index probe that finds nothing
    # (a table of a few rows, as the small run's alone is, may be read whole instead).
    large, small = last_batch_reads(clock, LARGE), last_batch_reads(clock, SMALL)
    assert large == (0, "succeeded")
    assert small[0] <= SMALL and small[1] == "succeeded"


def test_a_batch_ending_a_maps_instance_and_another_runs_task_releases_that_tasks_children(clock):
    # One worker batch, two runs: an instance of a map that goes on (its run is only settled,
    # mapping.SETTLE) and the parent of a child in a run that neither maps nor branches.
    mapping_run = Run.objects.create(logical_date=clock.now(), trigger="manual", state="running", dynamic=True)
    TaskRun.objects.create(run=mapping_run, task="m", state="mapped", spec={"map_over": "items"}, downstream=[])
    done = TaskRun.objects.create(run=mapping_run, task="m", map_index=0, state="succeeded", downstream=[])
    TaskRun.objects.create(run=mapping_run, task="m", map_index=1, state="running", downstream=[])
    plain = Run.objects.create(logical_date=clock.now(), trigger="manual", state="running")
    a = TaskRun.objects.create(run=plain, task="a", state="succeeded", downstream=["b"])
    TaskRun.objects.create(run=plain, task="b", state="waiting", upstream=["a"], downstream=[])
    released = resolver.resolve_runs([mapping_run.pk, plain.pk], now=clock.now(), dynamic={mapping_run.pk},
                                     quiet={mapping_run.pk}, ended=[done.pk, a.pk])
    assert released == 1
    assert TaskRun.objects.get(run=plain, task="b").state == "scheduled"
    assert TaskRun.objects.get(run=mapping_run, task="m", map_index=-1).state == "mapped"
