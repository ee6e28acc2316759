"""One-task jobs' task runs (``spec.call`` "job") are no longer counted by the task-run triggers
(``orchestrator/counts.py``): a job's run reads its one task run instead. The trigger function
leaves them out, and the count rows they added are taken back (their present states subtracted,
then the rows of runs that sum to nothing deleted). The task-run table is locked against writers
first, so no statement counts a job's task run between the two."""

from django.db import migrations

LOCK = "LOCK TABLE orchestrator_taskrun IN SHARE ROW EXCLUSIVE MODE;"

_FUNCTION = """
CREATE OR REPLACE FUNCTION orchestrator_count_task_runs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO orchestrator_taskruncount (run_id, instances_of, state, n)
        SELECT n.run_id, CASE WHEN n.map_index >= 0 THEN n.task ELSE '' END, n.state, count(*) FROM new_rows n
        WHERE {insert}
        GROUP BY 1, 2, 3;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO orchestrator_taskruncount (run_id, instances_of, state, n)
        SELECT x.run_id, x.grp, v.state, sum(v.d) FROM (
            SELECT n.run_id, CASE WHEN n.map_index >= 0 THEN n.task ELSE '' END AS grp, n.state AS now_in, o.state AS was_in
            FROM new_rows n JOIN old_rows o ON o.id = n.id WHERE o.state <> n.state AND {update}
        ) x CROSS JOIN LATERAL (VALUES (x.now_in, 1), (x.was_in, -1)) AS v(state, d)
        GROUP BY 1, 2, 3;
    ELSE
        -- Task runs deleted with their run (retention) are not counted back: the run's rows go.
        INSERT INTO orchestrator_taskruncount (run_id, instances_of, state, n)
        SELECT o.run_id, CASE WHEN o.map_index >= 0 THEN o.task ELSE '' END, o.state, -count(*) FROM old_rows o
        WHERE o.run_id = ANY (ARRAY(SELECT r.id FROM orchestrator_run r
                                    WHERE r.id = ANY (ARRAY(SELECT DISTINCT run_id FROM old_rows))))
          AND {delete}
        GROUP BY 1, 2, 3;
    END IF;
    RETURN NULL;
END $$;
"""

UNCOUNTED = _FUNCTION.format(insert="(n.spec->>'call') IS DISTINCT FROM 'job'",
                             update="(n.spec->>'call') IS DISTINCT FROM 'job'",
                             delete="(o.spec->>'call') IS DISTINCT FROM 'job'")
COUNTED = _FUNCTION.format(insert="true", update="true", delete="true")

# The job task runs' contributions taken back (their present states: what their rows add up to),
# then the rows of the runs whose every count is now zero.
FORGET = """
INSERT INTO orchestrator_taskruncount (run_id, instances_of, state, n)
SELECT t.run_id, CASE WHEN t.map_index >= 0 THEN t.task ELSE '' END, t.state, -count(*) FROM orchestrator_taskrun t
WHERE (t.spec->>'call') = 'job' GROUP BY 1, 2, 3;

WITH sums AS (
    SELECT run_id, instances_of, state, sum(n) AS n FROM orchestrator_taskruncount GROUP BY 1, 2, 3
), empty AS (
    SELECT run_id FROM sums GROUP BY run_id HAVING bool_and(n = 0)
)
DELETE FROM orchestrator_taskruncount c USING empty e WHERE c.run_id = e.run_id;
"""

# Going back: count them again.
RECOUNT = """
INSERT INTO orchestrator_taskruncount (run_id, instances_of, state, n)
SELECT t.run_id, CASE WHEN t.map_index >= 0 THEN t.task ELSE '' END, t.state, count(*) FROM orchestrator_taskrun t
WHERE (t.spec->>'call') = 'job' GROUP BY 1, 2, 3;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('orchestrator', '0036_map_indexes'),
    ]

    operations = [
        migrations.RunSQL(LOCK + UNCOUNTED + FORGET, LOCK + COUNTED + RECOUNT),
    ]
