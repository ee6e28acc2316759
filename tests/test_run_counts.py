"""A run's counts by state are kept as its task runs change state (``orchestrator/counts.py``):
they agree with the task runs after every kind of writer (a real worker's claims and outcomes, the
resolver, mapping, cancel, deletes), reading them reads a few dozen rows whether the run has 1,000
task runs or 100,000, and the resolver's batches fold them so they stay that few."""

import pytest
from django.db import connection

from orchestrator import control, counts, reads
from orchestrator.bench.pages import fill_run
from orchestrator.counts import TaskRunCount
from orchestrator.models import Run, TaskRun, Workflow
from tests.support.features_support import worker_loop
from tests.test_execution_rules import execute_claimed
from tests.test_mapping_scale import big, mapped_run  # noqa: F401 - fixture
from tests.test_pages_at_size import explained, rows_read

pytestmark = pytest.mark.django_db

# What the counts were read with before they were kept: one index entry per task run.
COUNTED_FROM_TASK_RUNS = """
SELECT CASE WHEN map_index >= 0 THEN task END, state, count(*) FROM orchestrator_taskrun
WHERE run_id = %(run)s GROUP BY 1, 2
"""


def truth(run_id: int) -> set[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(COUNTED_FROM_TASK_RUNS, {"run": run_id})
        return set(cursor.fetchall())


def kept(run_id: int) -> set[tuple]:
    return set(counts.run_counts(run_id))


def count_rows(run_id: int) -> int:
    return TaskRunCount.objects.filter(run_id=run_id).count()


def test_the_counts_follow_a_map_run_by_a_real_worker_to_its_end(big, clock):  # noqa: F811
    loop = worker_loop()
    run = mapped_run(big, clock, loop, 95)
    assert kept(run.pk) == truth(run.pk)
    assert ("one", "scheduled", 95) in kept(run.pk)
    most = 0
    for _ in range(30):
        if not execute_claimed(loop, 4, clock):
            break
        # After every batch (claims, outcomes, the map's step, the run's end), the same counts.
        assert kept(run.pk) == truth(run.pk)
        most = max(most, count_rows(run.pk))
    run.refresh_from_db()
    assert run.state == "succeeded"
    assert kept(run.pk) == {(None, "succeeded", 3), ("one", "succeeded", 95)}
    # About 24 batches of four instances, each adding rows: folded as they went, never past the
    # fold's threshold and one batch's rows.
    assert most < counts.FOLD_AT + 8, most
    counted = reads.run_counts(run.pk)
    assert counted.tasks == {"succeeded": 3} and counted.instances == {"one": {"succeeded": 95}}


def test_the_counts_follow_cancel_deletes_and_a_deleted_run(big, clock):  # noqa: F811
    loop = worker_loop()
    run = mapped_run(big, clock, loop, 12)
    execute_claimed(loop, 3, clock)
    control.cancel_run(run)
    assert kept(run.pk) == truth(run.pk)
    assert ("one", "cancelled", 9) in kept(run.pk)
    # Task runs deleted from a run that stays are subtracted.
    TaskRun.objects.filter(run=run, map_index__gte=10).delete()
    assert kept(run.pk) == truth(run.pk)
    # A run deleted (retention) takes its counts with it, whatever the order of the deletes.
    other = mapped_run(big, clock, loop, 5)
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        cursor.execute("DELETE FROM orchestrator_run WHERE id = %s", [other.pk])
        cursor.execute("DELETE FROM orchestrator_attempt WHERE task_run_id IN "
                       "(SELECT id FROM orchestrator_taskrun WHERE run_id = %s)", [other.pk])
        cursor.execute("DELETE FROM orchestrator_taskrun WHERE run_id = %s", [other.pk])
    Run.objects.filter(pk=run.pk).delete()
    assert not TaskRunCount.objects.filter(run_id__in=[run.pk, other.pk]).exists()


def test_a_statement_that_changes_no_state_adds_no_count(big, clock):  # noqa: F811
    run = mapped_run(big, clock, worker_loop(), 7)
    before = count_rows(run.pk)
    TaskRun.objects.filter(run=run).update(priority=5)
    assert count_rows(run.pk) == before


@pytest.mark.slow
def test_reading_the_counts_of_a_run_of_100000_reads_what_a_run_of_1000_does(clock):
    workflow = Workflow.objects.create(name="big_counts")
    made = {}
    for n in (100_000, 1_000):
        for mapped in (None, "square"):
            now = clock.now()
            run = Run.objects.create(workflow=workflow, trigger="manual", state="failed", logical_date=now,
                                     started_at=now, finished_at=now)
            fill_run(run, n, mapped)
            made[(n, mapped)] = run
    for (n, mapped), run in made.items():
        assert kept(run.pk) == truth(run.pk)
        plan = explained(counts.RUN_COUNTS.replace("%(run)s", str(run.pk)))
        # A handful of rows: one per group and state (a few more before a fold), not one per task run.
        assert rows_read(plan) <= 10, (n, mapped, rows_read(plan))
        # The grid's counts of the run's maps (web/mapped.summaries) likewise.
        grid = explained(counts.RUNS_INSTANCE_COUNTS.replace("%(runs)s", f"ARRAY[{run.pk}]::bigint[]"))
        assert rows_read(grid) <= 10, (n, mapped, rows_read(grid))
        # What it was: an index entry per task run.
        old = explained(COUNTED_FROM_TASK_RUNS.replace("%(run)s", str(run.pk)))
        assert rows_read(old) >= n


# --- one-task jobs: their run reads its task run, no count rows -----------------------------------


def test_a_job_adds_no_count_rows_from_enqueue_to_end_and_its_run_reads_its_task_run(clock):
    from orchestrator.jobs import enqueue_many
    from orchestrator.resolver import Ending, end_attempts

    [(job_run, _)] = enqueue_many([{"ref": "tests.support.tasks_for_tests:add", "args": [1, 2]}], now=clock.now())
    [(failing, _)] = enqueue_many([{"ref": "tests.support.tasks_for_tests:add", "args": ["x", 1]}], now=clock.now())
    loop = worker_loop()
    assert kept(job_run.pk) == truth(job_run.pk) == {(None, "scheduled", 1)}
    # Claimed and ended the worker's way: the job's run ends in the statement that ends its task run.
    messages = loop.claim(10, clock.now())
    assert kept(job_run.pk) == truth(job_run.pk) == {(None, "running", 1)}
    ok = next(m for m in messages if m["run_id"] == job_run.pk)
    bad = next(m for m in messages if m["run_id"] == failing.pk)
    end_attempts([Ending(ok["id"], ok["number"], "succeeded", result="3", job=True, run_id=job_run.pk),
                  Ending(bad["id"], bad["number"], "failed", error="TypeError", job=True, run_id=failing.pk)],
                 worker_id=loop.id, now=clock.now())
    assert kept(job_run.pk) == truth(job_run.pk) == {(None, "succeeded", 1)}
    assert kept(failing.pk) == truth(failing.pk) == {(None, "dead", 1)}
    assert (Run.objects.get(pk=job_run.pk).state, Run.objects.get(pk=failing.pk).state) == ("succeeded", "failed")
    # Created, claimed and ended: five count rows a job each, before; none now.
    assert count_rows(job_run.pk) == count_rows(failing.pk) == 0
    assert reads.run_counts(failing.pk).tasks == {"dead": 1}


def test_a_job_run_ended_by_the_resolver_reads_its_task_runs_state(clock):
    """Endings without the job flag (the reaper's, a control's) end a job's run in the resolver's
    end of runs (FINISH_RUNS): succeeded or failed as its uncounted task run says."""
    from orchestrator.jobs import enqueue_many

    made = enqueue_many([{"ref": "tests.support.tasks_for_tests:add", "args": args} for args in ([1, 2], ["x", 1])],
                        now=clock.now())
    loop = worker_loop()
    execute_claimed(loop, 10, clock)
    (good, _), (bad, _) = made
    assert (Run.objects.get(pk=good.pk).state, Run.objects.get(pk=bad.pk).state) == ("succeeded", "failed")
    assert kept(good.pk) == truth(good.pk) == {(None, "succeeded", 1)}
    assert kept(bad.pk) == truth(bad.pk) == {(None, "dead", 1)}
    assert count_rows(good.pk) == count_rows(bad.pk) == 0


def test_a_job_retried_from_the_dead_letter_queue_is_counted_from_its_task_run(clock):
    from orchestrator.jobs import enqueue_many

    [(run, _)] = enqueue_many([{"ref": "tests.support.tasks_for_tests:add", "args": ["x", 1]}], now=clock.now())
    loop = worker_loop()
    execute_claimed(loop, 10, clock)
    task_run = TaskRun.objects.get(run=run)
    assert control.retry_task_runs([task_run.pk], now=clock.now()) == 1
    assert kept(run.pk) == truth(run.pk) == {(None, "scheduled", 1)}
    assert Run.objects.get(pk=run.pk).state == "running"
    assert count_rows(run.pk) == 0
