"""A job's writes as HOT updates where PostgreSQL can make them so (measured by
pg_stat_user_tables' n_tup_hot_upd): no B-tree names a column that changes when a run starts
(run_schedule_delay) or when an attempt ends (attempt_running, attempt_reaped). The two indexes
the metrics read become BRIN (summarizing: PostgreSQL 16 and later still update in place past
them); the running attempts are found from their task runs (taskrun_running). A fill factor of 70
leaves room on each page of runs and attempts for the new version of the row the update writes."""

import django.contrib.postgres.indexes
from django.db import migrations, models

FILL = "ALTER TABLE {} SET (fillfactor = {})"


class Migration(migrations.Migration):

    dependencies = [
        ('orchestrator', '0030_tenants_grants'),
    ]

    operations = [
        migrations.RemoveIndex(model_name='attempt', name='attempt_running'),
        migrations.RemoveIndex(model_name='attempt', name='attempt_reaped'),
        migrations.RemoveIndex(model_name='run', name='run_schedule_delay'),
        migrations.AddIndex(
            model_name='attempt',
            index=django.contrib.postgres.indexes.BrinIndex(condition=models.Q(('outcome__in', ['lost', 'timed_out'])), fields=['finished_at'], name='attempt_reaped'),
        ),
        migrations.AddIndex(
            model_name='run',
            index=django.contrib.postgres.indexes.BrinIndex(condition=models.Q(('schedule_delay__isnull', False)), fields=['started_at'], name='run_schedule_delay'),
        ),
        migrations.RunSQL(
            [FILL.format("orchestrator_run", 70), FILL.format("orchestrator_attempt", 70)],
            [FILL.format("orchestrator_run", 100), FILL.format("orchestrator_attempt", 100)],
        ),
    ]
