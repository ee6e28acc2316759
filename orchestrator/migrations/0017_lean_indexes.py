"""Fewer index entries per write of a run, a task run and an attempt.

A job's run has no workflow, version, schedule, backfill or creator: those indexes become partial
(only the rows that have one), and the foreign keys lose the indexes of their own that another
index already leads with. The task run's and the attempt's worker are looked up only while
running. The active-run, deadline and timeout indexes take only runs that have a schedule, a
deadline or a timeout. Due work is read by queue first (``orchestrator.due``: a worker walks its own queues), and its
next due time from the same index. Every index is built and dropped concurrently, so the upgrade of a big table blocks no
writer (hence a migration that is not atomic); the new ones are in place before the old go.
"""

import django.db.models.deletion
from django.conf import settings
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('orchestrator', '0016_code_generation'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='run',
            index=models.Index(condition=models.Q(('workflow__isnull', False)), fields=['workflow', '-id'], name='run_of_workflow'),
        ),
        AddIndexConcurrently(
            model_name='run',
            index=models.Index(condition=models.Q(('workflow__isnull', False)), fields=['workflow', '-logical_date', '-id'], name='run_of_workflow_by_date'),
        ),
        AddIndexConcurrently(
            model_name='run',
            index=models.Index(condition=models.Q(('version__isnull', False)), fields=['version'], name='run_of_version'),
        ),
        AddIndexConcurrently(
            model_name='run',
            index=models.Index(condition=models.Q(('backfill__isnull', False)), fields=['backfill'], name='run_of_backfill'),
        ),
        AddIndexConcurrently(
            model_name='run',
            index=models.Index(condition=models.Q(('created_by__isnull', False)), fields=['created_by'], name='run_of_creator'),
        ),
        AddIndexConcurrently(
            model_name='run',
            index=models.Index(condition=models.Q(('finished_at__isnull', False)), fields=['finished_at'], name='run_finished_at'),
        ),
        AddIndexConcurrently(
            model_name='taskrun',
            index=models.Index(condition=models.Q(('state', 'running')), fields=['worker'], name='taskrun_running'),
        ),
        AddIndexConcurrently(
            model_name='run',
            index=models.Index(condition=models.Q(('schedule__isnull', False), ('state__in', ['pending', 'running'])), fields=['schedule', 'state'], name='run_active_of_schedule'),
        ),
        AddIndexConcurrently(
            model_name='run',
            index=models.Index(condition=models.Q(('deadline_at__isnull', False), ('deadline_missed_at__isnull', True), ('state__in', ['pending', 'running'])), fields=['deadline_at'], name='run_deadline_pending'),
        ),
        AddIndexConcurrently(
            model_name='run',
            index=models.Index(condition=models.Q(('state__in', ['pending', 'running']), ('timeout_at__isnull', False)), fields=['timeout_at'], name='run_timeout_pending'),
        ),
        AddIndexConcurrently(
            model_name='taskrun',
            index=models.Index(condition=models.Q(('state', 'scheduled')), fields=['queue', 'lane', 'tenant', 'priority', 'due_at', 'id'], name='taskrun_due_by_queue'),
        ),
        # One run per (schedule, fire time), for the runs of a schedule: the partial unique index is
        # built before the full constraint is dropped, so no moment is without one.
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(
                "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS run_one_per_fire_time "
                "ON orchestrator_run (schedule_id, logical_date) WHERE schedule_id IS NOT NULL",
                "DROP INDEX CONCURRENTLY IF EXISTS run_one_per_fire_time",
            )],
            state_operations=[migrations.AddConstraint(
                model_name='run',
                constraint=models.UniqueConstraint(condition=models.Q(('schedule__isnull', False)), fields=('schedule', 'logical_date'), name='run_one_per_fire_time'),
            )],
        ),
        migrations.RemoveConstraint(
            model_name='run',
            name='run_unique_fire_time',
        ),
        RemoveIndexConcurrently(
            model_name='run',
            name='run_by_workflow',
        ),
        RemoveIndexConcurrently(
            model_name='run',
            name='run_finished',
        ),
        RemoveIndexConcurrently(
            model_name='run',
            name='run_by_workflow_date',
        ),
        RemoveIndexConcurrently(
            model_name='run',
            name='run_active',
        ),
        RemoveIndexConcurrently(
            model_name='run',
            name='run_deadline_due',
        ),
        RemoveIndexConcurrently(
            model_name='run',
            name='run_timeout_due',
        ),
        RemoveIndexConcurrently(
            model_name='taskrun',
            name='taskrun_due_key',
        ),
        RemoveIndexConcurrently(
            model_name='taskrun',
            name='taskrun_next_due',
        ),
        migrations.AlterField(
            model_name='attempt',
            name='task_run',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='attempt_set', to='orchestrator.taskrun'),
        ),
        migrations.AlterField(
            model_name='attempt',
            name='worker',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='attempts', to='orchestrator.worker'),
        ),
        migrations.AlterField(
            model_name='run',
            name='backfill',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='runs', to='orchestrator.backfill'),
        ),
        migrations.AlterField(
            model_name='run',
            name='created_by',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, to=settings.AUTH_USER_MODEL),
        ),
        migrations.AlterField(
            model_name='run',
            name='schedule',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='runs', to='orchestrator.schedule'),
        ),
        migrations.AlterField(
            model_name='run',
            name='version',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='runs', to='orchestrator.workflowversion'),
        ),
        migrations.AlterField(
            model_name='run',
            name='workflow',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='runs', to='orchestrator.workflow'),
        ),
        migrations.AlterField(
            model_name='taskrun',
            name='run',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='task_runs', to='orchestrator.run'),
        ),
        migrations.AlterField(
            model_name='taskrun',
            name='worker',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='orchestrator.worker'),
        ),
    ]
