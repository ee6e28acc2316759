# ruff: noqa: F811 - pytest fixtures imported from tests.support
"""A clear with past or future runs over a long history reads through indexes only the runs it
touches, up to its bound (clearing.MOST + 1 task runs): not the workflow's every run. Rows read are
counted from pg_stat_xact_user_tables (this transaction's own counters), never timed."""

import pytest
from django.db import connection

from orchestrator import clearing
from orchestrator.models import Run, RunState, TaskState
from tests.support.actions_support import chain, finished_run, task_run  # noqa: F401 - fixture

pytestmark = pytest.mark.django_db

HISTORY = 50_000

# The workflow's history in two statements: HISTORY finished runs an hour apart from 2020 on, each
# with its five task runs succeeded; every 10,000th run's b failed (and c upstream-failed).
FILL_RUNS = """
INSERT INTO orchestrator_run (workflow_id, version_id, logical_date, trigger, params, tenant, priority, lane,
    state, reason, payload_hash, created_at, started_at, finished_at)
SELECT %(workflow)s, %(version)s, timestamptz '2020-01-01' + g * interval '1 hour', 'schedule', '{}'::jsonb,
       'default', 0, 0, CASE WHEN g %% 10000 = 0 THEN 'failed' ELSE 'succeeded' END, '', '', now(), now(), now()
FROM generate_series(1, %(n)s) AS g
"""
FILL_TASK_RUNS = """
INSERT INTO orchestrator_taskrun (run_id, task, map_index, state, spec, upstream, queue, priority, tenant, lane,
    attempts, max_attempts, error, created_at, started_at, finished_at)
SELECT r.id, t, -1, CASE WHEN r.state = 'failed' AND t = 'b' THEN 'failed'
                         WHEN r.state = 'failed' AND t = 'c' THEN 'upstream_failed' ELSE 'succeeded' END,
       '{}'::jsonb, '{}'::varchar[], 'default', 0, 'default', 0, 1, 1, '', now(), now(), now()
FROM orchestrator_run r CROSS JOIN unnest(ARRAY['a', 'b', 'c', 'd', 'e']) AS t
WHERE r.workflow_id = %(workflow)s AND r.logical_date < timestamptz '2026-01-01'
"""

READ = """
SELECT relname, seq_tup_read + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables
WHERE relname IN ('orchestrator_run', 'orchestrator_taskrun')
"""


def rows_read() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(READ)
        return dict(cursor.fetchall())


def read_by(action) -> tuple[object, dict[str, int]]:
    before = rows_read()
    result = action()
    after = rows_read()
    return result, {table: after[table] - before.get(table, 0) for table in after}


@pytest.fixture
def history(chain):
    """The chain's HISTORY old runs, and the picked one (2026-03-20, after them all) whose b failed."""
    with connection.cursor() as cursor:
        cursor.execute(FILL_RUNS, {"workflow": chain.pk, "version": chain.current_version_id, "n": HISTORY})
        cursor.execute(FILL_TASK_RUNS, {"workflow": chain.pk})
        cursor.execute("ANALYZE orchestrator_run")
        cursor.execute("ANALYZE orchestrator_taskrun")
    picked = finished_run(chain, 20, {"b": TaskState.FAILED, "c": TaskState.UPSTREAM_FAILED},
                          run_state=RunState.FAILED)
    return task_run(picked, "b")


def test_a_clear_with_past_or_future_runs_reads_the_runs_its_bound_needs_not_the_history(history):
    plan, read = read_by(lambda: clearing.plan_task_clear(history, clearing.ClearScope(past=True)))
    # b and c of every run: more than the bound, so counted to it and refused.
    assert plan.too_many and plan.count == clearing.MOST + 1
    assert [(row["task"], row["logical_date"].year) for row in plan.rows[:3]] == [("b", 2020), ("c", 2020), ("b", 2020)]
    # About MOST / 2 runs (two tasks each) and their task runs, not the 50,000 runs.
    assert read["orchestrator_run"] <= clearing.MOST // 2 + 10, read
    assert read["orchestrator_taskrun"] <= clearing.MOST + 50, read

    # The same from the first run on, forward: d alone (nothing downstream), in date order.
    first = task_run(Run.objects.filter(workflow=history.run.workflow).order_by("logical_date").first(), "d")
    plan, read = read_by(lambda: clearing.plan_task_clear(first, clearing.ClearScope(future=True)))
    assert plan.too_many and plan.rows[0]["run"] == first.run_id
    dates = [row["logical_date"] for row in plan.rows]
    assert dates == sorted(dates) and dates[1] > first.run.logical_date
    assert read["orchestrator_run"] <= clearing.MOST + 10, read
    assert read["orchestrator_taskrun"] <= clearing.MOST + 50, read


def test_only_failed_with_past_runs_reads_the_failures_not_the_history(history):
    scope = clearing.ClearScope(past=True, only_failed=True)
    plan, read = read_by(lambda: clearing.plan_task_clear(history, scope))
    failed_runs = HISTORY // 10_000
    assert (plan.count, plan.runs) == (2 * failed_runs + 2, failed_runs + 1)  # b and c of each, and the picked run's
    assert {row["state"] for row in plan.rows} == {"failed", "upstream_failed"}
    assert read["orchestrator_run"] <= 40 and read["orchestrator_taskrun"] <= 50, read
