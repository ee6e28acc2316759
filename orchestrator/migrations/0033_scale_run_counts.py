"""A run's task runs counted by state as they change (``orchestrator/counts.py``): the table of
count changes, the statement-level triggers that write them, and the counts of the task runs that
exist already. Creating the triggers locks the task-run table against writers until this
migration commits, so the counts written here and the triggers' rows add up exactly. A task run's
children by name (``TaskRun.downstream``), so the resolver reads only the children of what ended;
NULL on the task runs made before, for which it reads every waiting task run of the run."""

import django.contrib.postgres.fields
from django.db import migrations, models


COUNT_TASK_RUNS = """
CREATE OR REPLACE FUNCTION orchestrator_count_task_runs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO orchestrator_taskruncount (run_id, instances_of, state, n)
        SELECT n.run_id, CASE WHEN n.map_index >= 0 THEN n.task ELSE '' END, n.state, count(*) FROM new_rows n GROUP BY 1, 2, 3;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO orchestrator_taskruncount (run_id, instances_of, state, n)
        SELECT x.run_id, x.grp, v.state, sum(v.d) FROM (
            SELECT n.run_id, CASE WHEN n.map_index >= 0 THEN n.task ELSE '' END AS grp, n.state AS now_in, o.state AS was_in
            FROM new_rows n JOIN old_rows o ON o.id = n.id WHERE o.state <> n.state
        ) x CROSS JOIN LATERAL (VALUES (x.now_in, 1), (x.was_in, -1)) AS v(state, d)
        GROUP BY 1, 2, 3;
    ELSE
        -- Task runs deleted with their run (retention) are not counted back: the run's rows go.
        INSERT INTO orchestrator_taskruncount (run_id, instances_of, state, n)
        SELECT o.run_id, CASE WHEN o.map_index >= 0 THEN o.task ELSE '' END, o.state, -count(*) FROM old_rows o
        WHERE o.run_id = ANY (ARRAY(SELECT r.id FROM orchestrator_run r
                                    WHERE r.id = ANY (ARRAY(SELECT DISTINCT run_id FROM old_rows))))
        GROUP BY 1, 2, 3;
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION orchestrator_forget_run_counts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM orchestrator_taskruncount c WHERE c.run_id = ANY (ARRAY(SELECT id FROM old_rows));
    RETURN NULL;
END $$;

CREATE TRIGGER taskrun_counted_insert AFTER INSERT ON orchestrator_taskrun
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION orchestrator_count_task_runs();
CREATE TRIGGER taskrun_counted_update AFTER UPDATE ON orchestrator_taskrun
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT
    EXECUTE FUNCTION orchestrator_count_task_runs();
CREATE TRIGGER taskrun_counted_delete AFTER DELETE ON orchestrator_taskrun
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION orchestrator_count_task_runs();
CREATE TRIGGER run_counts_forgotten AFTER DELETE ON orchestrator_run
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION orchestrator_forget_run_counts();

INSERT INTO orchestrator_taskruncount (run_id, instances_of, state, n)
SELECT t.run_id, CASE WHEN t.map_index >= 0 THEN t.task ELSE '' END, t.state, count(*) FROM orchestrator_taskrun t GROUP BY 1, 2, 3
"""

DROP = """
DROP TRIGGER IF EXISTS run_counts_forgotten ON orchestrator_run;
DROP TRIGGER IF EXISTS taskrun_counted_delete ON orchestrator_taskrun;
DROP TRIGGER IF EXISTS taskrun_counted_update ON orchestrator_taskrun;
DROP TRIGGER IF EXISTS taskrun_counted_insert ON orchestrator_taskrun;
DROP FUNCTION IF EXISTS orchestrator_forget_run_counts();
DROP FUNCTION IF EXISTS orchestrator_count_task_runs();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('orchestrator', '0032_ui_actions_notes'),
    ]

    operations = [
        migrations.CreateModel(
            name='TaskRunCount',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('run_id', models.BigIntegerField()),
                ('instances_of', models.CharField(blank=True, default='', max_length=255)),
                ('state', models.CharField(max_length=16)),
                ('n', models.BigIntegerField()),
            ],
            options={
                'indexes': [models.Index(fields=['run_id'], name='taskruncount_run')],
            },
        ),
        migrations.RunSQL(COUNT_TASK_RUNS, DROP),
        migrations.AddField(
            model_name='taskrun',
            name='downstream',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=255), blank=True, null=True, size=None),
        ),
    ]
