"""A workflow's settled days counted per state (``orchestrator/run_days.py``): the table, and the
triggers on orchestrator_run that forget a day's counts when a run of it is added with an old
logical date, leaves a finished state or is deleted. Nothing is kept yet: the calendar fills it
as it is viewed."""

from django.db import migrations, models

FUNCTIONS = '''
CREATE OR REPLACE FUNCTION orchestrator_runday_forget_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('orchestrator.calendar.' || NEW.workflow_id, 0));
        DELETE FROM orchestrator_runday WHERE workflow_id = NEW.workflow_id
            AND day BETWEEN (NEW.logical_date AT TIME ZONE 'UTC')::date - 1
                        AND (NEW.logical_date AT TIME ZONE 'UTC')::date + 1;
    ELSE
        PERFORM pg_advisory_xact_lock(hashtextextended('orchestrator.calendar.' || OLD.workflow_id, 0));
        DELETE FROM orchestrator_runday WHERE workflow_id = OLD.workflow_id
            AND day BETWEEN (OLD.logical_date AT TIME ZONE 'UTC')::date - 1
                        AND (OLD.logical_date AT TIME ZONE 'UTC')::date + 1;
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION orchestrator_runday_forget_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('orchestrator.calendar.' || w, 0))
    FROM (SELECT DISTINCT workflow_id AS w FROM old_rows WHERE workflow_id IS NOT NULL ORDER BY 1) AS o;
    DELETE FROM orchestrator_runday k
    USING (SELECT DISTINCT workflow_id, (logical_date AT TIME ZONE 'UTC')::date AS d FROM old_rows
           WHERE workflow_id IS NOT NULL) AS o
    WHERE k.workflow_id = o.workflow_id AND k.day BETWEEN o.d - 1 AND o.d + 1;
    RETURN NULL;
END $$;
'''

TRIGGERS = '''
CREATE TRIGGER run_day_reopened AFTER UPDATE OF state ON orchestrator_run FOR EACH ROW
    WHEN (OLD.state IN ('succeeded', 'failed', 'cancelled', 'skipped', 'missed') AND NEW.state IS DISTINCT FROM OLD.state
          AND OLD.workflow_id IS NOT NULL)
    EXECUTE FUNCTION orchestrator_runday_forget_row();
CREATE TRIGGER run_day_added AFTER INSERT ON orchestrator_run FOR EACH ROW
    WHEN (NEW.workflow_id IS NOT NULL AND NEW.logical_date < now() - interval '1 day')
    EXECUTE FUNCTION orchestrator_runday_forget_row();
CREATE TRIGGER run_day_deleted AFTER DELETE ON orchestrator_run
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION orchestrator_runday_forget_deleted();
'''

DROP = '''
DROP TRIGGER IF EXISTS run_day_deleted ON orchestrator_run;
DROP TRIGGER IF EXISTS run_day_added ON orchestrator_run;
DROP TRIGGER IF EXISTS run_day_reopened ON orchestrator_run;
DROP FUNCTION IF EXISTS orchestrator_runday_forget_deleted();
DROP FUNCTION IF EXISTS orchestrator_runday_forget_row();
'''


class Migration(migrations.Migration):

    dependencies = [
        ('orchestrator', '0034_clear_failed_index'),
    ]

    operations = [
        migrations.CreateModel(
            name='RunDay',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('workflow_id', models.BigIntegerField()),
                ('zone', models.CharField(max_length=64)),
                ('day', models.DateField()),
                ('state', models.CharField(max_length=16)),
                ('n', models.BigIntegerField()),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('workflow_id', 'day', 'zone', 'state'), name='runday_unique')],
            },
        ),
        migrations.RunSQL(FUNCTIONS + TRIGGERS, DROP),
    ]
